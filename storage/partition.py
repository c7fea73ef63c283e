"""Hive-style partitions: `key=value` directories between a dataset's root and its files.

    s3://corpus/news/year=2026/month=12/part-0.parquet   (root s3://corpus/news)
      -> {"year": "2026", "month": "12"}

The dataset's root is the directory the user named (or a glob's fixed part, or a
single file's directory), less any `key=value` directories it ends in: naming
`news/year=2026` or globbing `news/year=2026/*/*.parquet` still gives each file its
year, so a directory and a glob over the same files agree.

Values are kept as strings, %-escapes decoded (Hive and Spark escape "/", "=", ...),
and Hive's marker for a null value becomes None. Directories that are not
`key=value` are skipped, so `root/2026/lang=en/x.parquet` gives {"lang": "en"}.
"""

from __future__ import annotations

import posixpath
from urllib.parse import unquote

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def hive_partition(root: str, path: str) -> dict[str, str | None]:
    """The partition of the file `path` under the dataset directory `root` (both fsspec paths)."""
    relative = posixpath.relpath(path, root.rstrip("/") or "/") if root else path
    if relative.startswith(".."):
        return {}
    partition: dict[str, str | None] = {}
    for segment in relative.split("/")[:-1]:
        key, sep, value = segment.partition("=")
        if not sep or not key:
            continue
        partition[unquote(key)] = None if value == HIVE_NULL else unquote(value)
    return partition


def partition_root(directory: str) -> str:
    """`directory` less the `key=value` directories it ends in: where partition keys start."""
    segments = directory.rstrip("/").split("/")
    while len(segments) > 1 and "=" in segments[-1] and not segments[-1].startswith("="):
        segments.pop()
    return "/".join(segments)
