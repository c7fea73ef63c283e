"""Over s3:// against a real S3 API server: a hive-partitioned dataset with a carried column,
through to an errors file committed with the output."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from storage import (Manifest, commit_output, encode_schema, inspect_input, part_name, plan_shards, read_errors,
                     read_manifest, read_results, read_shard, resolve, write_errors_file, write_part)
from tests.integration.s3server import S3Server

COLUMNS = {"input_column": "text", "id_column": "doc_id"}


@pytest.fixture(scope="module")
def s3_server():
    with S3Server() as server:
        yield server


def put_parquet(url: str, table: pa.Table, options: dict) -> None:
    fs, path = resolve(url, options)
    with fs.open(path, "wb") as file:
        pq.write_table(table, file, row_group_size=4)


def corpus(start: int, num_rows: int) -> pa.Table:
    ids = list(range(start, start + num_rows))
    return pa.table({"doc_id": ids, "text": [f"doc {i}" for i in ids], "lang": ["en", "de"] * (num_rows // 2)})


def test_partitioned_dataset_with_carried_columns_and_an_errors_file(s3_server):
    # Given a bucket holding a dataset partitioned by year and month
    options = s3_server.storage_options
    bucket = f"barge-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    for index, (year, month) in enumerate([("2025", "12"), ("2026", "01"), ("2026", "02")]):
        put_parquet(f"s3://{bucket}/ds/year={year}/month={month}/part.parquet", corpus(10 * index, 10), options)
    output = f"s3://{bucket}/out"

    # When it is planned with a carried column and partition columns, run, and committed with its errors
    info = inspect_input(f"s3://{bucket}/ds/", columns=COLUMNS, storage_options=options,
                         carry_columns=["lang"], partition_columns=True)
    parts = []
    for shard in plan_shards(info, max_rows_per_shard=6):
        rows = pa.Table.from_batches(list(read_shard(shard, ["doc_id", "lang"], storage_options=options,
                                                     partition_columns=True)))
        errors = pa.array([f"failed {i}" if i % 7 == 0 else None for i in rows.column("doc_id").to_pylist()],
                          pa.string())
        table = rows.append_column("error", errors)
        parts.append(write_part(output, part_name(shard), table, storage_options=options))
    errors_file = write_errors_file(output, parts, id_column="doc_id", storage_options=options)
    manifest = Manifest(job_id="j", mode="generate", model="m", spec={}, parts=tuple(parts),
                        schema=encode_schema(table.schema), stats={}, created_at="now", errors_file=errors_file)
    commit_output(output, manifest, storage_options=options)

    # Then the results carry lang, year and month, and the errors file lists the failed rows once each
    assert info.partition_keys == ("year", "month")
    results = read_results(output, storage_options=options)
    assert results.column_names == ["doc_id", "lang", "year", "month", "error"]
    assert results.column("doc_id").to_pylist() == list(range(30))
    assert results.column("year").to_pylist() == ["2025"] * 10 + ["2026"] * 20
    assert results.column("month").to_pylist() == ["12"] * 10 + ["01"] * 10 + ["02"] * 10
    assert read_errors(output, storage_options=options) == [{"id": i, "error": f"failed {i}"} for i in (0, 7, 14, 21, 28)]
    assert read_manifest(output, storage_options=options).errors_file == errors_file
