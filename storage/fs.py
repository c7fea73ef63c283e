"""The one place where URLs are resolved through fsspec.

Everything else in `storage` works on a `(filesystem, path)` pair obtained here.
Credentials and endpoints come from `storage_options` (passed straight to the
fsspec filesystem, e.g. s3fs's `key`, `secret`, `client_kwargs`) or from the
standard environment variables the backend reads itself (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, ...). Neither is ever logged or put in
an error message: use `redact` on any URL that goes into a message.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

import fsspec
from fsspec.implementations.local import LocalFileSystem

# Object stores: no directories, and no rename (so no atomic move of a temporary file).
_OBJECT_STORE_PROTOCOLS = {"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "oss"}

# "scheme://user:password@host/..." -> "scheme://***@host/..."
_USERINFO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*://)[^/@]*@")


def resolve(url: str, storage_options: dict | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """Return the filesystem for `url` and the path within it.

    Accepts local paths (relative ones are made absolute), file://, s3://,
    memory:// and any other scheme fsspec knows.
    """
    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    return fs, path


def to_url(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """The URL that `resolve` turns back into `(fs, path)`; local files stay plain paths."""
    if is_local(fs):
        return path
    return fs.unstrip_protocol(path)


def join(path: str, name: str) -> str:
    """`path/name` for fsspec paths, which always use "/"."""
    return posixpath.join(path.rstrip("/"), name)


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """True for the local disk, where a rename within a directory is atomic."""
    return isinstance(fs, LocalFileSystem)


def make_dirs(fs: fsspec.AbstractFileSystem, path: str) -> None:
    """Create the directory `path` where the backend has directories.

    Not on object stores: there a "directory" is only a key prefix, and s3fs's
    makedirs would create a missing bucket rather than report it.
    """
    if is_object_store(fs):
        return
    fs.makedirs(path, exist_ok=True)


def is_object_store(fs: fsspec.AbstractFileSystem) -> bool:
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    return bool(protocols & _OBJECT_STORE_PROTOCOLS)


@contextmanager
def open_for_read(fs: fsspec.AbstractFileSystem, path: str) -> Iterator[str | IO[bytes]]:
    """A source to hand to pyarrow: a plain path locally, else an uncached fsspec file.

    NOTE: remote files are opened without fsspec's read-ahead cache (s3fs reads
    50 MiB ahead by default). pyarrow already asks for exactly the byte ranges it
    needs (the footer, then one column chunk at a time), so each read becomes one
    ranged GET and memory stays bounded by what pyarrow holds.
    """
    if is_local(fs):
        yield path
        return
    with fs.open(path, "rb", cache_type="none") as file:
        yield file


def redact(url: str) -> str:
    """`url` without any `user:password@` part, for messages and logs."""
    return _USERINFO.sub(r"\1***@", url)
