"""The whole storage path over memory://, the same code as for S3."""

from __future__ import annotations

import io
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


class CountingFile(io.BytesIO):
    """A file that adds every byte read to a shared counter."""

    def __init__(self, data: bytes, counter: list[int]):
        super().__init__(data)
        self.counter = counter

    def read(self, size=-1):
        chunk = super().read(size)
        self.counter[0] += len(chunk)
        return chunk


def test_inspect_reads_only_footers_and_a_shard_only_its_row_groups(root, columns, monkeypatch):
    # Given a ~2 MB file of 8 row groups on memory://, whose opened files count the bytes read
    fs, path = resolve(root)
    num_rows = 80_000
    table = pa.table({"doc_id": pa.array(range(num_rows), pa.int64()),
                      "text": [uuid.UUID(int=i * 7919).hex * 2 for i in range(num_rows)]})
    with fs.open(f"{path}/big.parquet", "wb") as file:
        pq.write_table(table, file, row_group_size=num_rows // 8, compression="none")
    file_size = fs.size(f"{path}/big.parquet")
    bytes_read = [0]
    monkeypatch.setattr(fs, "_open", lambda p, mode="rb", **kwargs: CountingFile(fs.cat_file(p), bytes_read))

    # When the input is inspected, then only about the footer is read
    info = inspect_input(f"{root}/big.parquet", columns=columns)
    assert info.files[0].num_row_groups == 8
    assert bytes_read[0] < file_size / 20

    # When one shard of two row groups is read, then about a quarter of the file is read
    bytes_read[0] = 0
    shard = plan_shards(info, max_rows_per_shard=num_rows // 4)[1]
    assert sum(batch.num_rows for batch in read_shard(shard, ["doc_id", "text"])) == num_rows // 4
    assert bytes_read[0] < file_size / 3
