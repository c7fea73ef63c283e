"""The one place where URLs are resolved through fsspec.

Everything else in `storage` works on a `(filesystem, path)` pair obtained here.
Credentials and endpoints come from `storage_options` (passed straight to the
fsspec filesystem, e.g. s3fs's `key`, `secret`, `client_kwargs`) or from the
standard environment variables the backend reads itself (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, ...). Neither is ever logged or put in
an error message: use `redact` (storage.redaction.redact_url) on any URL that goes
into a message, and `describe` on any backend error.

On S3 a flaky network is retried in two layers. botocore retries throttling
(503 SlowDown), 5xx answers, dropped connections and timeouts; set it through
storage_options, e.g.

    {"config_kwargs": {"retries": {"max_attempts": 10, "mode": "standard"},
                       "connect_timeout": 10, "read_timeout": 60}}

(or AWS_RETRY_MODE / AWS_MAX_ATTEMPTS). s3fs adds its own few tries with backoff
for SlowDown and some network errors. A write that still fails raises OutputError
and leaves nothing visible (see storage.write); the shard is then re-run.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

import fsspec
from fsspec.implementations.local import LocalFileSystem

# Barge's one redaction (storage.redaction), under the names storage's modules use:
# redact(url) for a URL in a message, redact_urls(text) for an error or a log line.
from storage.redaction import redact_text as redact_urls, redact_url as redact  # noqa: F401

# Object stores: no directories, and no rename (so no atomic move of a temporary file).
_OBJECT_STORE_PROTOCOLS = {"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "oss"}

# storage_options keys (at any depth) whose values are secrets: key, secret, token,
# aws_secret_access_key, password, account_key, sas_token, client_secret, ... Broader than
# storage.redaction's SECRET_NAME on purpose: s3fs's plain "key" is the access key id, and
# these values are only searched for in error text, never shown.
_SECRET_OPTION = re.compile(r"key|secret|token|password|credential|sas", re.IGNORECASE)
# Environment variables a backend may read credentials from.
_SECRET_ENV = re.compile(r"SECRET|TOKEN|PASSWORD|ACCESS_KEY|ACCOUNT_KEY|CREDENTIAL")
_MIN_SECRET_LENGTH = 4  # shorter values would scrub ordinary words out of messages


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


def describe(error: BaseException, storage_options: dict | None = None) -> str:
    """`error` as "Type: message" for an error message, with credentials taken out.

    Backends word their own errors, and some quote what they were given (an endpoint
    URL with a password in it, a malformed key): userinfo and query strings in any
    URL, the values of secret-looking storage_options and of credential environment
    variables become ***.
    """
    text = redact_urls(f"{type(error).__name__}: {error}")
    for secret in sorted(_secrets(storage_options), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _secrets(storage_options: dict | None) -> set[str]:
    found = {value for name, value in os.environ.items() if _SECRET_ENV.search(name)}
    found |= set(_secret_values(storage_options or {}))
    return {value for value in found if isinstance(value, str) and len(value) >= _MIN_SECRET_LENGTH}


def _secret_values(options: dict) -> Iterator[str]:
    for name, value in options.items():
        if isinstance(value, dict):
            yield from _secret_values(value)
        elif isinstance(value, str) and _SECRET_OPTION.search(str(name)):
            yield value
