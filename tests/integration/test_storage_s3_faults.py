"""The storage path over s3:// through injected faults: throttling, dropped connections, failed uploads.

A FaultyProxy sits between s3fs and a real S3 API server (moto, over HTTP). Retries
come from botocore, configured through storage_options the way a deployment would:

    config_kwargs={"retries": {"max_attempts": 10, "mode": "standard"}}

and exactly-once output comes from the upload never being visible until complete.
"""

from __future__ import annotations

import os
import uuid

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from storage import (InputError, Manifest, OutputError, commit_output, encode_schema, inspect_input, part_name,
                     plan_shards, read_results, read_shard, resolve, write_part)
from tests.integration.s3server import ACCESS_KEY, REGION, SECRET_KEY, S3Server
from tests.support.faulty_proxy import Fault, FaultRule, FaultyProxy

COLUMNS = {"input_column": "text", "id_column": "doc_id"}
BLOCK_SIZE = 5 * 2**20  # the smallest multipart part S3 allows


@pytest.fixture(scope="module")
def s3_server():
    with S3Server() as server:
        yield server


@pytest.fixture
def proxy(s3_server):
    with FaultyProxy(s3_server.endpoint_url) as faulty:
        yield faulty


@pytest.fixture
def options(proxy) -> dict:
    """storage_options for s3fs through the proxy, with botocore's standard retries."""
    return {"key": ACCESS_KEY, "secret": SECRET_KEY, "default_block_size": BLOCK_SIZE,
            "client_kwargs": {"endpoint_url": proxy.endpoint_url, "region_name": REGION},
            "config_kwargs": {"retries": {"max_attempts": 10, "mode": "standard"},
                              "connect_timeout": 5, "read_timeout": 30}}


@pytest.fixture
def bucket(s3_server):
    name = f"barge-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(name)
    return name


@pytest.fixture
def direct(s3_server):
    """A boto3 client straight to the server: what any reader sees, no proxy in between."""
    return boto3.client("s3", endpoint_url=s3_server.endpoint_url, region_name=REGION,
                        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)


def corpus(num_rows: int, start: int = 0) -> pa.Table:
    ids = list(range(start, start + num_rows))
    return pa.table({"doc_id": ids, "text": [f"document {i}" for i in ids]})


def put_parquet(url: str, table: pa.Table, options: dict, row_group_size: int) -> None:
    fs, path = resolve(url, options)
    with fs.open(path, "wb") as file:
        pq.write_table(table, file, row_group_size=row_group_size)


def big_part(num_rows: int, row_bytes: int) -> pa.Table:
    """Results that do not compress: a part of about num_rows * row_bytes bytes."""
    return pa.table({"doc_id": list(range(num_rows)),
                     "payload": [os.urandom(row_bytes) for _ in range(num_rows)]})


def manifest_of(parts, schema: pa.Schema) -> Manifest:
    return Manifest(job_id="job-faults", mode="generate", model="echo", spec={}, parts=tuple(parts),
                    schema=encode_schema(schema), stats={}, created_at="2026-12-01T00:00:00Z")


def run_job(input_url: str, output: str, options: dict) -> tuple[list, pa.Schema]:
    info = inspect_input(input_url, columns=COLUMNS, storage_options=options)
    parts = []
    for shard in plan_shards(info, max_rows_per_shard=100):
        rows = pa.Table.from_batches(list(read_shard(shard, ["doc_id", "text"], storage_options=options)))
        parts.append(write_part(output, part_name(shard), rows, storage_options=options))
    commit_output(output, manifest_of(parts, rows.schema), storage_options=options)
    return parts, rows.schema


def test_the_whole_path_survives_throttling_and_dropped_connections(proxy, options, bucket):
    # Given an input in S3, and a network that throttles and drops every kind of request a few times
    put_parquet(f"s3://{bucket}/in/a.parquet", corpus(250), options, row_group_size=50)
    put_parquet(f"s3://{bucket}/in/b.parquet", corpus(120, start=250), options, row_group_size=50)
    for rule in [FaultRule(Fault.SLOWDOWN, method="GET", query="list-type"),  # listing
                 FaultRule(Fault.DROP, method="GET", query="list-type"),
                 FaultRule(Fault.SLOWDOWN, method="GET", path="/in/", times=2),  # footers, row groups
                 FaultRule(Fault.DROP, method="GET", path="/in/b.parquet"),
                 FaultRule(Fault.SLOWDOWN, method="PUT", path="/out/part-"),  # parts
                 FaultRule(Fault.DROP, method="PUT", path="/out/part-"),
                 FaultRule(Fault.SLOWDOWN, method="PUT", path="_manifest.json"),  # the commit
                 FaultRule(Fault.DROP, method="PUT", path="_SUCCESS")]:
        proxy.add(rule)

    # When a job is planned, read, written and committed through it
    run_job(f"s3://{bucket}/in/*.parquet", f"s3://{bucket}/out", options)

    # Then every fault happened, was retried, and the result holds every row exactly once
    assert len(proxy.faults(Fault.SLOWDOWN)) == 5 and len(proxy.faults(Fault.DROP)) == 4
    proxy.clear()
    assert read_results(f"s3://{bucket}/out", storage_options=options).column("doc_id").to_pylist() == list(range(370))


def test_a_part_under_the_block_size_is_one_put_and_one_over_it_a_multipart_upload(proxy, options, bucket):
    output = f"s3://{bucket}/out"
    small = write_part(output, "part-00000-00000.parquet", corpus(10), storage_options=options)
    assert proxy.requests("PUT", query="partNumber") == [] and proxy.requests("POST") == []

    large = write_part(output, "part-00000-00001.parquet", big_part(48, 2**18), storage_options=options)  # ~12 MiB

    assert large.num_bytes > 2 * BLOCK_SIZE
    assert len(proxy.requests("POST", query="uploads")) == 1  # CreateMultipartUpload
    assert len(proxy.requests("PUT", query="partNumber")) == 3  # 5 MiB, 5 MiB, the rest
    assert len(proxy.requests("POST", query="uploadId")) == 1  # CompleteMultipartUpload
    fs, path = resolve(output, options)
    assert len(fs.cat_file(f"{path}/{large.name}")) == large.num_bytes
    assert len(fs.cat_file(f"{path}/{small.name}")) == small.num_bytes


@pytest.mark.parametrize("failing", [
    FaultRule(Fault.ERROR, method="PUT", query="partNumber=2", status=400, code="InvalidArgument"),
    FaultRule(Fault.ERROR, method="POST", query="uploadId", status=400, code="InvalidPart"),
    FaultRule(Fault.SLOWDOWN, method="PUT", query="partNumber=3", times=None),  # beyond every retry
], ids=["a part", "the completion", "a part, throttled for ever"])
def test_a_failed_multipart_upload_leaves_nothing_visible_and_a_retry_writes_the_part(
        proxy, options, bucket, direct, failing):
    output, name = f"s3://{bucket}/out", "part-00000-00007.parquet"
    options = {**options, "config_kwargs": {"retries": {"max_attempts": 2, "mode": "standard"}}}
    table = big_part(48, 2**18)
    proxy.add(failing)

    # When the upload fails, then write_part says so and no object, not even a short one, exists
    with pytest.raises(OutputError, match=rf"cannot write {name} to s3://{bucket}/out: "):
        write_part(output, name, table, storage_options=options)
    assert direct.list_objects_v2(Bucket=bucket).get("KeyCount") == 0
    assert direct.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []  # aborted, not left behind

    # When the shard is re-run, then the part is whole and the output has every row exactly once
    failing.times = 0
    part = write_part(output, name, table, storage_options=options)
    commit_output(output, manifest_of([part], table.schema), storage_options=options)
    assert read_results(output, storage_options=options).column("doc_id").to_pylist() == list(range(48))


def test_a_failed_overwrite_leaves_the_previous_part_whole(proxy, options, bucket, direct):
    output, name = f"s3://{bucket}/out", "part-00000-00000.parquet"
    before = write_part(output, name, big_part(48, 2**18), storage_options=options)
    proxy.add(FaultRule(Fault.ERROR, method="POST", query="uploadId", status=400, code="InvalidPart"))

    with pytest.raises(OutputError):
        write_part(output, name, big_part(48, 2**18), storage_options=options)

    assert direct.head_object(Bucket=bucket, Key=f"out/{name}")["ContentLength"] == before.num_bytes
    commit_output(output, manifest_of([before], big_part(0, 1).schema), storage_options=options)
    assert read_results(output, storage_options=options).num_rows == 48  # checksum of the first write holds


def test_reads_give_up_with_an_input_error_when_throttling_outlasts_the_retries(proxy, options, bucket):
    put_parquet(f"s3://{bucket}/in/a.parquet", corpus(10), options, row_group_size=5)
    options = {**options, "config_kwargs": {"retries": {"max_attempts": 2, "mode": "standard"}}}
    proxy.add(FaultRule(Fault.SLOWDOWN, method="GET", path="/in/a.parquet", times=None))
    with pytest.raises(InputError, match=rf"s3://{bucket}/in/a.parquet: "):
        inspect_input(f"s3://{bucket}/in/a.parquet", columns=COLUMNS, storage_options=options)
