"""Turn the user's `input` (a URL, a glob, a directory, or a list of them) into files."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from storage.errors import InputError
from storage.fs import describe, redact, resolve, to_url
from storage.partition import hive_partition, partition_root

_GLOB_CHARS = ("*", "?", "[")


@dataclass(frozen=True)
class ListedFile:
    """One input file and the hive partition its directories give it."""

    url: str
    partition: dict[str, str | None] = field(default_factory=dict)  # key -> value, outermost first
    num_bytes: int = 0  # the size the listing gave; 0 when unknown


def list_input_files(input: str | list[str], storage_options: dict | None = None) -> list[str]:
    """The URLs of every input file, in listing order (see `list_inputs`)."""
    return [listed.url for listed in list_inputs(input, storage_options)]


def list_inputs(input: str | list[str], storage_options: dict | None = None) -> list[ListedFile]:
    """Every input file, in a deterministic order, with its hive partition.

    Each entry expands on its own, in the order given:
      - a glob (`*`, `?`, `[`)  -> the matching files, sorted;
      - a directory             -> every `*.parquet` below it, recursively, sorted,
                                   skipping names that start with "." or "_"
                                   (temporary files, `_SUCCESS`, `_manifest.json`);
      - anything else           -> that one file, which must exist.
    A file named twice is kept once, at its first position.
    The partition comes from `key=value` directories (see storage.partition for
    where they start).
    Raises InputError when an entry matches nothing.
    """
    urls = [input] if isinstance(input, str) else list(input)
    if not urls:
        raise InputError("input is an empty list: name at least one file, directory or glob")
    found: dict[str, ListedFile] = {}
    for url in urls:
        for listed in _expand_one(url, storage_options):
            found.setdefault(listed.url, listed)
    return list(found.values())


def _expand_one(url: str, storage_options: dict | None) -> list[ListedFile]:
    try:
        return _list_one(url, storage_options)
    except InputError:
        raise
    except Exception as error:  # noqa: BLE001 - every backend raises its own kinds
        raise InputError(f"{redact(url)}: cannot list the input ({describe(error, storage_options)})") from error


def _list_one(url: str, storage_options: dict | None) -> list[ListedFile]:
    fs, path = resolve(url, storage_options)
    # fsspec keeps filesystems (and s3fs their listings) for the life of the process; a
    # long-lived planner must see files added since its last job.
    fs.invalidate_cache()
    # Sizes come with the listing: readers then need no request to ask for them
    # (fsspec keeps a filesystem, and s3fs its listing cache, per thread).
    if any(char in path for char in _GLOB_CHARS):
        sizes = {p: info.get("size") or 0 for p, info in fs.glob(path, detail=True).items() if info["type"] == "file"}
        root, problem = _glob_root(path), "no files match the pattern"
    elif fs.isdir(path):
        sizes = {p: info.get("size") or 0 for p, info in fs.find(path, detail=True).items() if _is_data_file(p)}
        root, problem = path, "the directory holds no *.parquet files"
    elif fs.isfile(path):
        sizes = {path: fs.info(path).get("size") or 0}
        root, problem = posixpath.dirname(path), ""
    else:
        raise InputError(f"{redact(url)}: no such file or directory")
    if not sizes:
        raise InputError(f"{redact(url)}: {problem}")
    root = partition_root(root)
    return [ListedFile(url=to_url(fs, p), partition=hive_partition(root, p), num_bytes=sizes[p]) for p in sorted(sizes)]


def _glob_root(pattern: str) -> str:
    """The directory above the first glob character: `a/b/year=*/x*.parquet` -> `a/b`."""
    first = min(pattern.index(char) for char in _GLOB_CHARS if char in pattern)
    return posixpath.dirname(pattern[:first])


def _is_data_file(path: str) -> bool:
    name = posixpath.basename(path)
    return name.endswith(".parquet") and not name.startswith((".", "_"))


