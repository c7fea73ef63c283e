"""Small files bundled at submit (storage.bundle) and submit's inspection kept for planning
(storage.inspection), on fsspec's in-memory filesystem (a remote filesystem to storage: no
local paths), with every read counted: the rows come back exactly, each file is read once,
a lost bundle costs bytes and never rows."""

from __future__ import annotations

import io

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import storage.inputs
from storage import inspect_input, plan_shards, read_shard
from storage.bundle import stage_small_files
from storage.inspection import load_inspection, save_inspection
from tests.support.counting_fs import count_reads

COLUMNS = {"input_column": "text", "id_column": "doc_id"}
READ = ["text", "doc_id"]


@pytest.fixture
def memory():
    """fsspec's memory filesystem, emptied after each test (its store is shared by the process)."""
    fs = fsspec.filesystem("memory")
    yield fs
    fs.store.clear()
    fs.pseudo_dirs[:] = [""]


def put(fs, path: str, start: int, num_rows: int, **options) -> None:
    sink = io.BytesIO()
    ids = list(range(start, start + num_rows))
    pq.write_table(pa.table({"doc_id": ids, "text": [f"row {i}" for i in ids], "extra": [0.5] * num_rows}),
                   sink, **options)
    fs.pipe_file(path, sink.getvalue())


def read_ids(shards) -> list[int]:
    return [i for shard in shards for batch in read_shard(shard, READ) for i in batch.column("doc_id").to_pylist()]


def test_tiny_files_are_read_once_and_come_back_from_their_bundles(memory):
    for f in range(300):
        put(memory, f"/in/f{f:04d}.parquet", 3 * f, 3)
    with count_reads(memory) as reads:
        checked = inspect_input("memory://in/", columns=COLUMNS, summarize_ids=True, keep_columns=READ)
        submit_bytes = reads.num_bytes
        kept, report = stage_small_files(checked, plan_shards(checked, max_rows_per_shard=400), READ,
                                         "memory://out/_barge_staging/job")
        save_inspection(kept, "memory://out/_barge_staging/job")
        info = load_inspection("memory://out/_barge_staging/job")
        shards = plan_shards(info, max_rows_per_shard=400)
        reads.reset()
        assert read_ids(shards) == list(range(900))
        shard_bytes = reads.num_bytes
    size = sum(memory.size(f"/in/f{f:04d}.parquet") for f in range(300))
    assert submit_bytes == size, "each file whole, once, with its footer"
    assert (report.num_files, report.num_bundles) == (300, 3) and len(shards) == 3
    assert shard_bytes == report.num_bytes_written, "the shards read their bundles and no input file"
    assert info.ids == checked.ids and info.files[5].staged_row_start == 15
    assert [f.num_rows for f in info.files] == [f.num_rows for f in checked.files]


def test_a_lost_bundle_is_read_from_the_input_and_a_split_file_is_not_bundled(memory):
    put(memory, "/in/a.parquet", 0, 5)
    put(memory, "/in/b.parquet", 5, 40, row_group_size=10)   # split over two shards: not bundled
    put(memory, "/in/c.parquet", 45, 5)
    checked = inspect_input("memory://in/", columns=COLUMNS, keep_columns=READ)
    shards = plan_shards(checked, max_rows_per_shard=30)
    kept, _ = stage_small_files(checked, shards, READ, "memory://out/_barge_staging/job")
    assert [f.staged_url is not None for f in kept.files] == [True, False, True]
    staged = plan_shards(kept, max_rows_per_shard=30)
    assert read_ids(staged) == list(range(50))
    memory.rm("/out/_barge_staging/job", recursive=True)
    assert read_ids(staged) == list(range(50)), "the input still has the rows"


def test_past_the_memory_budget_files_are_not_kept(memory, monkeypatch):
    for f in range(20):
        put(memory, f"/in/f{f:02d}.parquet", 2 * f, 2)
    monkeypatch.setattr(storage.inputs, "MAX_KEPT_BYTES", 5 * 30)   # about five files' rows
    info = inspect_input("memory://in/", columns=COLUMNS, keep_columns=READ)
    assert 0 < len(info.small_tables) < 20
    kept, _ = stage_small_files(info, plan_shards(info), READ, "memory://out/_barge_staging/job")
    assert read_ids(plan_shards(kept)) == list(range(40))


def test_no_inspection_kept_means_planning_reads_the_footers(memory):
    assert load_inspection("memory://out/_barge_staging/none") is None
    memory.pipe_file("/out/_barge_staging/bad/input.json", b"{not json")
    assert load_inspection("memory://out/_barge_staging/bad") is None
