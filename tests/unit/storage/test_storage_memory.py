"""The whole storage path over memory://, the same code as for S3."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from storage import (InputError, check_writable, commit_output, encode_schema, inspect_input, is_committed,
                     part_name, plan_shards, read_results, read_shard, resolve, write_part)
from storage.manifest import Manifest


@pytest.fixture
def root():
    url = f"memory://barge-test-{uuid.uuid4().hex}"
    yield url
    fs, path = resolve(url)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def test_inspect_plan_read_write_commit_over_memory(root, make_table, columns):
    fs, path = resolve(root)
    for index, start in enumerate([0, 40]):
        with fs.open(f"{path}/in/{index}.parquet", "wb") as file:
            pq.write_table(make_table(40, start=start), file, row_group_size=16)
    output = f"{root}/out"

    info = inspect_input(f"{root}/in/*.parquet", columns=columns)
    shards = plan_shards(info, max_rows_per_shard=20)
    check_writable(output)
    parts = []
    for shard in shards:
        rows = pa.Table.from_batches(list(read_shard(shard, ["doc_id", "text"], batch_size=8)))
        parts.append(write_part(output, part_name(shard), rows))
    commit_output(output, Manifest(job_id="j", mode="embed", model="m", spec={}, parts=tuple(parts),
                                   schema=encode_schema(rows.schema), stats={}, created_at="now"))

    assert [f.url for f in info.files] == [f"memory://{path}/in/0.parquet", f"memory://{path}/in/1.parquet"]
    assert is_committed(output)
    assert read_results(output).column("doc_id").to_pylist() == list(range(80))


def test_not_parquet_over_memory_names_the_url(root, columns):
    fs, path = resolve(root)
    fs.pipe_file(f"{path}/x.parquet", b"definitely not parquet")
    with pytest.raises(InputError, match=r"memory://.*/x\.parquet: not a Parquet file"):
        inspect_input(f"{root}/x.parquet", columns=columns)
