"""Turn the user's `input` (a URL, a glob, a directory, or a list of them) into files."""

from __future__ import annotations

import posixpath

from storage.errors import InputError
from storage.fs import redact, resolve, to_url

_GLOB_CHARS = ("*", "?", "[")


def list_input_files(input: str | list[str], storage_options: dict | None = None) -> list[str]:
    """The URLs of every input file, in a deterministic order.

    Each entry expands on its own, in the order given:
      - a glob (`*`, `?`, `[`)  -> the matching files, sorted;
      - a directory             -> every `*.parquet` below it, recursively, sorted,
                                   skipping names that start with "." or "_"
                                   (temporary files, `_SUCCESS`, `_manifest.json`);
      - anything else           -> that one file, which must exist.
    A file named twice is kept once, at its first position.
    Raises InputError when an entry matches nothing.
    """
    urls = [input] if isinstance(input, str) else list(input)
    if not urls:
        raise InputError("input is an empty list: name at least one file, directory or glob")
    found: list[str] = []
    for url in urls:
        found.extend(_expand_one(url, storage_options))
    return list(dict.fromkeys(found))


def _expand_one(url: str, storage_options: dict | None) -> list[str]:
    fs, path = resolve(url, storage_options)
    # fsspec keeps filesystems (and s3fs their listings) for the life of the process; a
    # long-lived planner must see files added since its last job.
    fs.invalidate_cache()
    if any(char in path for char in _GLOB_CHARS):
        matches = fs.glob(path, detail=True)
        paths = sorted(p for p, info in matches.items() if info["type"] == "file")
        problem = "no files match the pattern"
    elif fs.isdir(path):
        paths = sorted(p for p in fs.find(path) if _is_data_file(p))
        problem = "the directory holds no *.parquet files"
    elif fs.isfile(path):
        paths = [path]
        problem = ""
    else:
        raise InputError(f"{redact(url)}: no such file or directory")
    if not paths:
        raise InputError(f"{redact(url)}: {problem}")
    return [to_url(fs, p) for p in paths]


def _is_data_file(path: str) -> bool:
    name = posixpath.basename(path)
    return name.endswith(".parquet") and not name.startswith((".", "_"))


