"""A 1,000,000-row input: planned from footers only, and each byte of the projected columns read once.

The input lives on memory://, read through the same fsspec path as S3, with every
byte handed to pyarrow counted (tests/support/counting_fs.py).
"""

from __future__ import annotations

import os
import time
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from storage import inspect_input, plan_shards, read_shard, resolve
from tests.support.counting_fs import count_reads

NUM_FILES = 8
ROWS_PER_FILE = 125_000
ROW_GROUP_ROWS = 10_000
COLUMNS = {"input_column": "text", "id_column": "doc_id"}
# Arrow's Parquet reader fetches the file's last 64 KiB to find the footer, once per open.
FOOTER_READ_BYTES = 64 * 1024


def file_table(file_index: int) -> pa.Table:
    start = file_index * ROWS_PER_FILE
    # Hex of random bytes: ~100 characters a row that compress only about 2x, like real text.
    raw = np.frombuffer(os.urandom(ROWS_PER_FILE * 50), dtype=np.uint8).reshape(ROWS_PER_FILE, 50)
    texts = pa.array([row.tobytes().hex() for row in raw], pa.string())
    return pa.table({"doc_id": pa.array(np.arange(start, start + ROWS_PER_FILE), pa.int64()),
                     "text": texts,
                     "score": pa.array(np.random.rand(ROWS_PER_FILE), pa.float64())})  # not projected: never read


@pytest.fixture(scope="module")
def corpus():
    root = f"memory://barge-scale-{uuid.uuid4().hex}"
    fs, path = resolve(root)
    for file_index in range(NUM_FILES):
        with fs.open(f"{path}/part-{file_index}.parquet", "wb") as file:
            pq.write_table(file_table(file_index), file, row_group_size=ROW_GROUP_ROWS)
    yield root, fs, path
    fs.rm(path, recursive=True)


def projected_compressed_bytes(fs, path: str, columns: list[str]) -> int:
    """What the projected column chunks take on disk, over every file: the least a reader must fetch."""
    total = 0
    for name in sorted(fs.ls(path, detail=False)):
        metadata = pq.ParquetFile(fs.open(name, "rb")).metadata
        for group in range(metadata.num_row_groups):
            for column in range(metadata.num_columns):
                chunk = metadata.row_group(group).column(column)
                if chunk.path_in_schema in columns:
                    total += chunk.total_compressed_size
    return total


def test_a_million_rows_plan_from_footers_only(corpus):
    root, fs, path = corpus
    total_bytes = sum(fs.size(name) for name in fs.ls(path, detail=False))

    with count_reads(fs) as reads:
        started = time.perf_counter()
        info = inspect_input(f"{root}/*.parquet", columns=COLUMNS)
        shards = plan_shards(info, max_rows_per_shard=100_000, max_work_per_shard=1_000_000)
        elapsed = time.perf_counter() - started

    print(f"\nplanned {info.num_rows:,} rows, {sum(f.num_row_groups for f in info.files)} row groups, "
          f"{len(shards)} shards in {elapsed:.2f} s, reading {reads.num_bytes:,} of {total_bytes:,} bytes")
    assert info.num_rows == 1_000_000 and reads.num_opens == NUM_FILES
    assert reads.num_bytes <= NUM_FILES * FOOTER_READ_BYTES  # footers only, never a data page
    assert sum(s.num_rows for s in shards) == 1_000_000
    assert all(s.work <= 1_000_000 for s in shards)
    assert plan_shards(inspect_input(f"{root}/*.parquet", columns=COLUMNS),
                       max_rows_per_shard=100_000, max_work_per_shard=1_000_000) == shards


def test_reading_every_shard_reads_each_projected_byte_once(corpus):
    root, fs, path = corpus
    columns = ["doc_id", "text"]
    shards = plan_shards(inspect_input(f"{root}/*.parquet", columns=COLUMNS),
                         max_rows_per_shard=100_000, max_work_per_shard=1_000_000)
    least = projected_compressed_bytes(fs, path, columns)

    with count_reads(fs) as reads:
        num_rows = sum(batch.num_rows for shard in shards for batch in read_shard(shard, columns, batch_size=4096))

    overhead = len(shards) * FOOTER_READ_BYTES  # each shard task opens its file and reads the footer
    print(f"\nread {reads.num_bytes:,} bytes for {least:,} bytes of projected column chunks "
          f"({reads.num_bytes / least:.3f}x) in {len(shards)} shards")
    assert num_rows == 1_000_000
    assert least <= reads.num_bytes <= least + overhead
