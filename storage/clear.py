"""Clearing an output that a job replaces (`if_exists="replace"`).

_SUCCESS goes first, so from the first deletion on no reader takes the folder for a
committed result; then the manifest, the errors and top-N files, then the part files.
Other files are left alone.
"""

from __future__ import annotations

from storage.errors import OutputError
from storage.fs import describe, join, redact, resolve
from storage.errors_file import ERRORS_NAME
from storage.top_n_file import TOP_N_NAME
from storage.manifest import MANIFEST_NAME, SUCCESS_NAME

PART_GLOB = "part-*.parquet"


def clear_output(output: str, storage_options: dict | None = None) -> int:
    """Remove a previous result from `output`; returns how many files went."""
    fs, path = resolve(output, storage_options)
    fs.invalidate_cache(path)  # s3fs listings never expire: see what is there now
    removed = 0
    try:
        for name in (SUCCESS_NAME, MANIFEST_NAME, ERRORS_NAME, TOP_N_NAME):
            if fs.exists(join(path, name)):
                fs.rm(join(path, name))
                removed += 1
        for part in sorted(fs.glob(join(path, PART_GLOB))):
            fs.rm(part)
            removed += 1
    except OSError as exc:
        raise OutputError(f"{redact(output)}: cannot clear the previous result "
                          f"({describe(exc, storage_options)})") from exc
    return removed
