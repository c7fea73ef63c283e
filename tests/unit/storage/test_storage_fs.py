"""URL resolution, the one place fsspec is asked for a filesystem."""

from __future__ import annotations

import os

import pytest

from storage.fs import is_local, is_object_store, join, redact, resolve, to_url


def test_local_paths_and_file_urls_resolve_to_the_same_file(tmp_path):
    plain_fs, plain = resolve(str(tmp_path / "a.parquet"))
    url_fs, from_url = resolve(f"file://{tmp_path}/a.parquet")
    assert is_local(plain_fs) and is_local(url_fs)
    assert plain == from_url == str(tmp_path / "a.parquet")
    assert to_url(plain_fs, plain) == plain


def test_relative_paths_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve("in/a.parquet")[1] == os.path.join(str(tmp_path), "in", "a.parquet")


def test_memory_urls_roundtrip():
    fs, path = resolve("memory://bucket/x.parquet")
    assert not is_local(fs) and not is_object_store(fs)
    assert resolve(to_url(fs, path))[1] == path


def test_s3_is_an_object_store_and_takes_storage_options():
    fs, path = resolve("s3://bucket/key.parquet", {"key": "k", "secret": "s", "anon": False})
    assert is_object_store(fs) and path == "bucket/key.parquet"
    assert to_url(fs, path) == "s3://bucket/key.parquet"


def test_join_uses_slashes():
    assert join("bucket/out/", "_SUCCESS") == "bucket/out/_SUCCESS"


@pytest.mark.parametrize("url, shown", [
    ("s3://AKIA:secret@bucket/key", "s3://***@bucket/key"),
    ("https://user:pw@host/x.parquet", "https://***@host/***"),   # a web URL's path is masked too
    ("s3://bucket/key@v1", "s3://bucket/key@v1"),
    ("/local/a@b.parquet", "/local/a@b.parquet"),
])
def test_redact_hides_credentials_in_urls(url, shown):
    assert redact(url) == shown


def test_unknown_scheme_is_fsspecs_error():
    with pytest.raises(ValueError):
        resolve("nosuchscheme://x")
