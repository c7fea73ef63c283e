"""Part files: deterministic names, atomic writes, the writability probe."""

from __future__ import annotations

import hashlib
import os

import pyarrow.parquet as pq
import pytest

from storage import OutputError, ShardPlan, check_writable, part_name, write_part
from storage.plan import ShardPiece


def test_part_name_is_deterministic():
    # A shard's part is named by its index (and its first input file): one part per shard, packed or not.
    pieces = tuple(ShardPiece(file_index=f, url=f"x{f}", row_groups=(0,), row_start=0, num_rows=1) for f in (3, 4))
    assert part_name(ShardPlan(shard_index=12, pieces=pieces)) == "part-00003-00012.parquet"


def test_write_part_leaves_only_the_part(tmp_path, make_table):
    output = str(tmp_path / "out")  # does not exist yet
    table = make_table(10)

    info = write_part(output, "part-00000-00000.parquet", table)

    assert os.listdir(output) == ["part-00000-00000.parquet"]
    data = (tmp_path / "out" / "part-00000-00000.parquet").read_bytes()
    assert (info.name, info.num_rows, info.num_bytes) == ("part-00000-00000.parquet", 10, len(data))
    assert info.sha256 == hashlib.sha256(data).hexdigest()
    assert pq.read_table(tmp_path / "out" / "part-00000-00000.parquet").equals(table)


def test_overwriting_a_part_is_allowed_and_deterministic(tmp_path, make_table):
    first = write_part(str(tmp_path), "part-00000-00000.parquet", make_table(10))
    again = write_part(str(tmp_path), "part-00000-00000.parquet", make_table(10))
    assert first == again
    assert os.listdir(tmp_path) == ["part-00000-00000.parquet"]


def test_failed_write_leaves_no_temporary_file(tmp_path, make_table, monkeypatch):
    def fail(*args):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OutputError, match="cannot write part-00000-00000.parquet to .*disk full"):
        write_part(str(tmp_path), "part-00000-00000.parquet", make_table(3))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", ["", "_SUCCESS", ".hidden.parquet", "a/b.parquet"])
def test_reserved_or_nested_part_names_are_refused(tmp_path, make_table, name):
    with pytest.raises(ValueError, match="part name"):
        write_part(str(tmp_path), name, make_table(1))


def test_check_writable_creates_the_directory_and_leaves_it_empty(tmp_path):
    output = tmp_path / "a" / "b"
    check_writable(str(output))
    assert output.is_dir() and os.listdir(output) == []


def test_check_writable_under_a_regular_file_names_url_and_reason(tmp_path):
    (tmp_path / "file").write_text("x")
    output = str(tmp_path / "file" / "out")
    with pytest.raises(OutputError, match=rf"output {output} is not writable: \w+Error"):
        check_writable(output)


def test_check_writable_on_a_regular_file(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match="is not writable"):
        check_writable(str(tmp_path / "file"))
