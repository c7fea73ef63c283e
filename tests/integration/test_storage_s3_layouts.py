"""Input layouts over a real S3 API server, with the bytes it serves counted per object
(a proxy in front of moto counts the body of every GET answer): a one-row-group file is
fetched about once over the job's whole storage path (submit's check, planning with its
id pass and staging, every shard's read), and thousands of tiny files pack into a few shards,
each fetched once: whole, with its footer, at submit (storage.bundle)."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import s3fs

from storage import inspect_input, plan_shards, read_shard
from storage.bundle import stage_small_files
from storage.inspection import load_inspection, save_inspection
from storage.stage import remove_staging, stage_split_pieces, staging_url
from tests.integration.s3server import S3Server
from tests.support.faulty_proxy import FaultyProxy

COLUMNS = {"input_column": "text", "id_column": "doc_id"}


@pytest.fixture(scope="module")
def s3():
    with S3Server() as server:
        server.create_bucket("corpus")
        yield server


@pytest.fixture
def proxy(s3):
    with FaultyProxy(s3.endpoint_url) as counting:
        yield counting


def options_via(proxy: FaultyProxy, s3: S3Server) -> dict:
    return {**s3.storage_options, "client_kwargs": {**s3.storage_options["client_kwargs"],
                                                    "endpoint_url": proxy.endpoint_url}}


def corpus(start: int, num_rows: int) -> pa.Table:
    ids = list(range(start, start + num_rows))
    return pa.table({"doc_id": pa.array(ids, pa.int64()),
                     "text": [f"document {i} about barge number {i * 7919 % 100003} on the river" for i in ids],
                     "extra": pa.array([float(i) for i in ids])})


def run_storage_path(input_url: str, output: str, options: dict, max_rows: int) -> tuple[list, list[int]]:
    """What a job does to the storage, in order: submit's check (footers, ids, small files' rows),
    which stages the small files and keeps the inspection; planning from that inspection,
    staging the big row groups; every shard's read."""
    staging = staging_url(output, "job")
    checked = inspect_input(input_url, columns=COLUMNS, storage_options=options, summarize_ids=True,
                            keep_columns=["text", "doc_id"])
    kept, _ = stage_small_files(checked, plan_shards(checked, max_rows_per_shard=max_rows), ["text", "doc_id"],
                                staging, options)
    save_inspection(kept, staging, options)
    info = load_inspection(staging, options)
    assert info is not None and info.ids == checked.ids
    shards = plan_shards(info, max_rows_per_shard=max_rows)
    shards, _ = stage_split_pieces(shards, ["text", "doc_id"], staging, options)
    ids = [i for shard in shards for batch in read_shard(shard, ["text", "doc_id"], storage_options=options)
           for i in batch.column("doc_id").to_pylist()]
    return shards, ids


def test_a_one_row_group_file_is_fetched_about_once_over_the_job(s3, proxy):
    fs = s3fs.S3FileSystem(**s3.storage_options)
    num_rows = 120_000
    with fs.open("corpus/big/one-group.parquet", "wb") as file:
        pq.write_table(corpus(0, num_rows), file, row_group_size=num_rows)
    size = fs.size("corpus/big/one-group.parquet")
    options = options_via(proxy, s3)

    shards, ids = run_storage_path("s3://corpus/big/", "s3://corpus/big-out", options, max_rows=2048)

    assert ids == list(range(num_rows))
    assert len(shards) == math.ceil(num_rows / 2048)
    served = proxy.bytes_served("/corpus/big/")
    staged = proxy.bytes_served("/corpus/big-out/_barge_staging/")
    print(f"\none {size:,}-byte row group: {served:,} bytes served ({served / size:.2f}x), "
          f"staged copies {staged:,} bytes read once each")
    assert served <= 1.3 * size
    written = sum(info["size"] for info in fs.ls("corpus/big-out/_barge_staging/job", detail=True))
    assert staged == written   # each staged file fetched once, whole
    remove_staging("s3://corpus/big-out", "job", s3.storage_options)
    assert not fs.exists("corpus/big-out/_barge_staging/job")


def test_two_thousand_tiny_files_pack_into_a_few_shards(s3, proxy):
    fs = s3fs.S3FileSystem(**s3.storage_options)
    num_files, rows_per_file, max_rows = 2000, 3, 2048
    for f in range(num_files):
        with fs.open(f"corpus/tiny/f{f:05d}.parquet", "wb") as file:
            pq.write_table(corpus(f * rows_per_file, rows_per_file), file)
    size = sum(info["size"] for info in fs.ls("corpus/tiny", detail=True))
    options = options_via(proxy, s3)

    shards, ids = run_storage_path("s3://corpus/tiny/", "s3://corpus/tiny-out", options, max_rows=max_rows)

    num_rows = num_files * rows_per_file
    assert ids == list(range(num_rows))
    assert len(shards) <= math.ceil(num_rows / max_rows) + 1
    served = proxy.bytes_served("/corpus/tiny/")
    bundles = proxy.bytes_served("/corpus/tiny-out/_barge_staging/job/small-")
    written = sum(info["size"] for info in fs.ls("corpus/tiny-out/_barge_staging/job", detail=True)
                  if "/small-" in info["name"])
    print(f"\n{num_files} tiny files, {size:,} bytes: {len(shards)} shards, {served:,} bytes served "
          f"({served / size:.2f}x: each file whole once, with its footer at submit); "
          f"{len(shards)} bundles of {written:,} bytes read once each")
    assert served <= 1.3 * size
    assert all(p.staged_url for s in shards for p in s.pieces), "every tiny file is read from its shard's bundle"
    assert bundles == written   # each bundle fetched once, whole
    assert len(proxy.requests("GET")) <= num_files + 3 * len(shards) + 5, "no file is asked for twice"
    assert not [r for r in proxy.requests("HEAD") if r.path.startswith("/corpus/tiny/")], \
        "sizes come from the listing, not a request per file"
