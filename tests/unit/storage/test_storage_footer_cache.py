"""A local file's checked footer is kept per process while the file is unchanged
(storage.footer): a worker cutting many shards from one file of many row groups parses its
footer once; a file rewritten in place is read again; a footer that lies is never kept."""

from __future__ import annotations

import os

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from storage import InputError
from storage import footer as footer_module
from storage.footer import _LocalFooters, read_footer

FS = fsspec.filesystem("file")


def _write(path, num_rows: int, row_group_size: int = 2) -> None:
    pq.write_table(pa.table({"doc_id": pa.array(range(num_rows), pa.int64())}), path, row_group_size=row_group_size)


@pytest.fixture
def footers(monkeypatch) -> _LocalFooters:
    fresh = _LocalFooters(footer_module.LOCAL_FOOTER_CACHE_BYTES)
    monkeypatch.setattr(footer_module, "_local_footers", fresh)
    return fresh


def test_an_unchanged_file_is_parsed_once(tmp_path, footers, monkeypatch):
    path = str(tmp_path / "a.parquet")
    _write(path, 200)
    first = read_footer(FS, path, path)
    parsed = []
    monkeypatch.setattr(footer_module.pq, "read_metadata", lambda *a, **k: parsed.append(a) or pq.read_metadata(*a))
    assert read_footer(FS, path, path) is first and parsed == []
    assert first.metadata.num_row_groups == 100


def test_a_file_rewritten_in_place_is_read_again(tmp_path, footers):
    path = str(tmp_path / "a.parquet")
    _write(path, 200)
    assert read_footer(FS, path, path).metadata.num_rows == 200
    _write(path, 100)
    os.utime(path, ns=(1, 1))     # even with an mtime from the past: the size differs
    assert read_footer(FS, path, path).metadata.num_rows == 100
    _write(path, 100, row_group_size=50)      # the same rows, another size and mtime
    assert read_footer(FS, path, path).metadata.num_row_groups == 2


def test_a_footer_that_lies_is_refused_every_time_and_never_kept(tmp_path, footers):
    path = tmp_path / "short.parquet"
    _write(path, 200)
    data = path.read_bytes()
    footer_length = int.from_bytes(data[-8:-4], "little")
    path.write_bytes(data[:100] + data[-footer_length - 8:])   # the footer, most of the data gone
    for _ in range(2):
        with pytest.raises(InputError, match="footer lies"):
            read_footer(FS, str(path), "s3://bucket/short.parquet")
    assert not footers.footers


def test_the_cache_keeps_at_most_its_bytes_least_recent_out(tmp_path, footers):
    paths = [str(tmp_path / f"{i}.parquet") for i in range(3)]
    for path in paths:
        _write(path, 200)
    size = read_footer(FS, paths[0], paths[0]).metadata.serialized_size
    footers.max_bytes = 2 * size
    read_footer(FS, paths[1], paths[1])
    read_footer(FS, paths[0], paths[0])          # 0 is now the most recent
    read_footer(FS, paths[2], paths[2])          # 1 goes
    assert [key[0] for key in footers.footers] == [paths[0], paths[2]] and footers.num_bytes == 2 * size
