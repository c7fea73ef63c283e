"""The storage path end to end over s3://, against a real S3 API server (moto, over HTTP)."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import s3fs

from storage import (InputError, Manifest, OutputError, check_writable, commit_output, encode_schema,
                     inspect_input, is_committed, part_name, plan_shards, read_manifest, read_results,
                     read_shard, resolve, write_part)
from tests.integration.s3server import S3Server

COLUMNS = {"input_column": "text", "id_column": "doc_id"}


@pytest.fixture(scope="session")
def s3_server():
    with S3Server() as server:
        yield server


@pytest.fixture
def bucket(s3_server):
    name = f"barge-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(name)
    return f"s3://{name}"


def put_parquet(url: str, table: pa.Table, storage_options: dict, row_group_size: int) -> None:
    fs, path = resolve(url, storage_options)
    with fs.open(path, "wb") as file:
        pq.write_table(table, file, row_group_size=row_group_size)


def corpus(num_rows: int, start: int) -> pa.Table:
    ids = list(range(start, start + num_rows))
    return pa.table({"doc_id": ids, "text": [f"document {i}" for i in ids], "lang": ["en"] * num_rows})


def test_job_path_over_s3(s3_server, bucket):
    # Given two input files with several row groups in a bucket
    options = s3_server.storage_options
    put_parquet(f"{bucket}/in/2026-12-01/a.parquet", corpus(300, 0), options, row_group_size=64)
    put_parquet(f"{bucket}/in/2026-12-01/b.parquet", corpus(50, 300), options, row_group_size=64)
    output = f"{bucket}/out/2026-12-01/"

    # When a job is planned, run shard by shard and committed
    info = inspect_input(f"{bucket}/in/2026-12-01/*.parquet", columns=COLUMNS, storage_options=options)
    shards = plan_shards(info, max_rows_per_shard=100)
    check_writable(output, storage_options=options)
    parts = []
    for shard in shards:
        rows = pa.Table.from_batches(list(read_shard(shard, ["doc_id", "text"], batch_size=32,
                                                     storage_options=options)))
        results = rows.append_column("error", pa.nulls(rows.num_rows, pa.string()))
        parts.append(write_part(output, part_name(shard), results, storage_options=options))
    assert not is_committed(output, storage_options=options)
    manifest = Manifest(job_id="job-s3", mode="generate", model="echo", spec={"input": "..."}, parts=tuple(parts),
                        schema=encode_schema(results.schema), stats={"total": 350}, created_at="2026-12-01T00:00:00Z")
    commit_output(output, manifest, storage_options=options)

    # Then the results are exactly the input rows, once each, in order
    assert [f.url for f in info.files] == [f"{bucket}/in/2026-12-01/a.parquet", f"{bucket}/in/2026-12-01/b.parquet"]
    assert info.num_rows == 350 and info.files[0].row_group_rows == (64, 64, 64, 64, 44)
    assert is_committed(output, storage_options=options)
    assert read_manifest(output, storage_options=options) == manifest
    table = read_results(output, storage_options=options)
    assert table.column("doc_id").to_pylist() == list(range(350))
    assert table.schema.names == ["doc_id", "text", "error"]
    fs, path = resolve(output, options)
    assert sorted(name.rsplit("/", 1)[-1] for name in fs.ls(path, refresh=True)) == sorted(
        [part.name for part in parts] + ["_SUCCESS", "_manifest.json"])  # the probe is gone


def test_errors_over_s3_name_the_url(s3_server, bucket):
    options = s3_server.storage_options
    fs, path = resolve(f"{bucket}/junk.parquet", options)
    fs.pipe_file(path, b"not a parquet file at all")

    with pytest.raises(InputError, match=rf"{bucket}/junk\.parquet: not a Parquet file"):
        inspect_input(f"{bucket}/junk.parquet", columns=COLUMNS, storage_options=options)
    with pytest.raises(InputError, match="no files match"):
        inspect_input(f"{bucket}/none/*.parquet", columns=COLUMNS, storage_options=options)
    with pytest.raises(OutputError, match="has no _SUCCESS"):
        read_results(f"{bucket}/out", storage_options=options)
    missing_bucket = f"no-such-bucket-{uuid.uuid4().hex[:8]}"
    with pytest.raises(OutputError, match=rf"output s3://{missing_bucket}/out is not writable: .*bucket does not exist"):
        check_writable(f"s3://{missing_bucket}/out", storage_options=options)
    assert not fs.exists(missing_bucket)  # reported, not created


def test_a_long_lived_process_sees_files_added_since_its_last_listing(s3_server, bucket):
    # Given a listing that s3fs has cached
    options = s3_server.storage_options
    put_parquet(f"{bucket}/daily/a.parquet", corpus(3, 0), options, row_group_size=64)
    assert len(inspect_input(f"{bucket}/daily/", columns=COLUMNS, storage_options=options).files) == 1
    # When another writer (another process, in effect: its own client) adds a file
    other_writer = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    with other_writer.open(f"{bucket}/daily/b.parquet", "wb") as file:
        pq.write_table(corpus(3, 3), file)
    # Then the next inspection lists it
    info = inspect_input(f"{bucket}/daily/", columns=COLUMNS, storage_options=options)
    assert [f.url.rsplit("/", 1)[-1] for f in info.files] == ["a.parquet", "b.parquet"]
