"""The results cache across hosts, on a real store (SQLite and PostgreSQL) and a real S3
API server: a file one host cannot read is a miss for it and stays in the shared index
for the host that holds it; only a file gone for every host leaves it; prune deletes
what it reaches and keeps the rows of what it does not.

Two hosts are two Store clients over one database, each with its own disk. As with the
default data directory, their cache folders have the same path; host A's files, as host
B sees them, are not there: they are moved aside while B runs.
"""

from __future__ import annotations

import logging
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.cache_keys import row_key
from jobs.cache_reach import CacheReach
from jobs.client import Client
from jobs.records import JobRecord
from jobs.settings import Settings
from jobs.spec import JobSpec
from jobs.status import JobStatus
from jobs.store import Store
from queueing.result_cache import ResultCache
from storage.fs import resolve
from tests.integration.test_storage_s3 import bucket, s3_server  # noqa: F401 (fixtures)
from tests.integration.test_store import postgres_url, store, store_url  # noqa: F401 (fixtures)

NS = "c" * 64
TEXTS = ["a barge", "a lock", "a canal", "a towpath"]
MANY_HOSTS = {}            # no BARGE_SINGLE_HOST, no BARGE_SHARED_PATHS
ONE_HOST = {"BARGE_SINGLE_HOST": "1"}
DAY = 86_400.0


def reach(store_url: str, data_dir: Path, env: dict) -> CacheReach:
    """A host's view. Its network broker marks a deployment of many hosts; none is reached here."""
    settings = Settings(data_dir=data_dir, database_url=store_url, broker_url="amqp://guest@127.0.0.1//")
    return CacheReach(settings, env)


def incremental_job() -> JobRecord:
    spec = JobSpec(mode="embed", model="minilm", input="/in/a.parquet", output="/out/", incremental=True)
    return JobRecord(id=uuid.uuid4().hex, status=JobStatus.RUNNING, spec=spec, model_key="minilm", rows_total=4,
                     output_schema="", error=None, created_at=0.0, started_at=None, finished_at=None,
                     cache_namespace=NS)


def cache_on(store: Store, root: str, job: JobRecord, host: CacheReach) -> ResultCache:
    return ResultCache(store, root, job, ["embedding"], host)


def computed(num_rows: int) -> pa.Table:
    return pa.table({"embedding": [[float(i), 1.0] for i in range(num_rows)],
                     "error": pa.nulls(num_rows, pa.string())})


def fill(cache: ResultCache) -> str:
    """Host A's shard: every row missed, computed, written and indexed. The file's URL."""
    ids = pa.array(range(len(TEXTS)))
    cached = cache.lookup(ids, TEXTS, 0)
    assert cached.num_hits == 0
    write = cache.save(0, 1, cached.keys, computed(len(TEXTS)), cached)
    cache.register(write)
    return write.url


@contextmanager
def elsewhere(folder: Path):
    """`folder` on another host's disk: not there while the block runs."""
    aside = folder.with_name(folder.name + "-on-its-own-host")
    folder.rename(aside)
    try:
        yield
    finally:
        aside.rename(folder)


def test_a_file_on_another_hosts_disk_is_a_miss_there_and_stays_indexed(store, store_url, tmp_path, caplog):
    # Given host A cached a shard's rows in its cache folder
    job = incremental_job()
    a_cache = cache_on(store, str(tmp_path / "cache"), job, reach(store_url, tmp_path, MANY_HOSTS))
    url = fill(a_cache)

    # When host B (another client of the same database, its folder at the same path) looks the rows up
    store_b = Store(store_url)
    b_cache = cache_on(store_b, str(tmp_path / "cache"), job, reach(store_url, tmp_path, MANY_HOSTS))
    ids = pa.array(range(len(TEXTS)))
    with elsewhere(tmp_path / "cache" / NS), caplog.at_level(logging.WARNING, logger="barge.worker"):
        cached = b_cache.lookup(ids, TEXTS, 3)
        write = b_cache.save(3, 1, cached.keys, computed(len(TEXTS)), cached)

    # Then every row is a miss for B, said once for the shard, and the entries stay
    assert (cached.num_hits, cached.unreadable_rows) == (0, [0, 1, 2, 3])
    warnings = [r.getMessage() for r in caplog.records if "cannot read" in r.getMessage()]
    assert len(warnings) == 1 and "shard 3: 4 cached rows are in 1 cache files" in warnings[0]
    assert store.cache_size(NS) == 4 and [f.url for f in store.cache_files()] == [url]
    assert write is None, "rows indexed from another host are not cached again from B"
    # ... and A, where the file is, still reuses every row
    assert a_cache.lookup(ids, TEXTS, 3).num_hits == 4
    store_b.engine.dispose()


def test_on_one_host_a_missing_file_is_gone_and_leaves_the_index(store, store_url, tmp_path):
    job = incremental_job()
    cache = cache_on(store, str(tmp_path / "cache"), job, reach(store_url, tmp_path, ONE_HOST))
    ids = pa.array(range(len(TEXTS)))
    Path(fill(cache)).unlink()
    # A cache folder that is not there at all (a disk not mounted) is no evidence
    with elsewhere(tmp_path / "cache"):
        assert cache.lookup(ids, TEXTS, 0).unreadable_rows == [0, 1, 2, 3]
    assert store.cache_size(NS) == 4
    # The folder there, the file not: gone
    cached = cache.lookup(ids, TEXTS, 0)
    assert (cached.num_hits, cached.unreadable_rows) == (0, [])
    assert store.cache_size(NS) == 0 and store.cache_files() == []


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """Credentials and endpoint from the environment, as a worker has them (storage.fs)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)


def test_an_object_deleted_from_the_store_is_gone_for_every_host(store, store_url, tmp_path, s3_env, bucket):
    # Given host A cached rows on S3, and the object was deleted since
    job = incremental_job()
    url = fill(cache_on(store, f"{bucket}/cache", job, reach(store_url, tmp_path / "host-a", MANY_HOSTS)))
    fs, path = resolve(url)
    fs.rm(path)

    # When host B looks the rows up, then the object's entries leave the index
    store_b = Store(store_url)
    b_cache = cache_on(store_b, f"{bucket}/cache", job, reach(store_url, tmp_path / "host-b", MANY_HOSTS))
    cached = b_cache.lookup(pa.array(range(len(TEXTS))), TEXTS, 0)
    assert (cached.num_hits, cached.unreadable_rows) == (0, [])
    assert store.cache_size(NS) == 0 and store.cache_files() == []
    store_b.engine.dispose()


def test_a_bucket_this_host_does_not_find_is_no_evidence(store, store_url, tmp_path, s3_env):
    # Given entries on a bucket that this host's endpoint does not have (another endpoint's, say)
    url = f"s3://elsewhere-{uuid.uuid4().hex[:12]}/cache/{NS}/part.parquet"
    store.cache_register(NS, url, [(row_key(text), i) for i, text in enumerate(TEXTS)])
    cache = cache_on(store, str(tmp_path / "cache"), incremental_job(), reach(store_url, tmp_path, MANY_HOSTS))

    # When they are looked up, then they are misses, and they stay
    cached = cache.lookup(pa.array(range(len(TEXTS))), TEXTS, 0)
    assert (cached.num_hits, cached.unreadable_rows) == (0, [0, 1, 2, 3])
    assert store.cache_size(NS) == 4 and [f.url for f in store.cache_files()] == [url]


def test_prune_removes_only_what_it_reaches_and_keeps_the_rest_indexed(store_url, tmp_path, monkeypatch):
    # Given a schedule whose job cached in host A's folder, unused past its retention
    monkeypatch.delenv("BARGE_SINGLE_HOST", raising=False)
    monkeypatch.setenv("BARGE_SHARED_PATHS", str(tmp_path / "shared"))   # inputs and outputs; not the caches
    host_a = Client(settings=Settings(data_dir=tmp_path / "host-a", database_url=store_url,
                                      broker_url="filesystem://"))
    # B: its data directory at the same path on its own disk; its broker is never reached (prune sends nothing)
    host_b = Client(settings=Settings(data_dir=tmp_path / "host-a", database_url=store_url,
                                      broker_url="amqp://guest@127.0.0.1//"))
    namespace = scheduled_namespace(host_a, tmp_path / "shared")
    old = tmp_path / "host-a" / "cache" / namespace / "part-old.parquet"
    old.parent.mkdir(parents=True)
    old.write_bytes(b"rows")
    host_a.store.cache_register(namespace, str(old), [("a" * 64, 0)], now=time.time() - 3 * DAY)

    # When host B prunes (its cache folder at the same path), then it reports the file out of its reach and
    # its row stays
    with elsewhere(old.parent):
        report = host_b.schedules.prune("nightly")
    assert (report.cache_entries, report.cache_files, report.cache_files_out_of_reach) == (1, [], [str(old)])
    lines = "\n".join(report.lines())
    assert f"did not remove cache file {old}: not reachable from this host" in lines
    assert "removed 0 outputs, 1 cache entries, 0 cache files" in lines
    assert [f.url for f in host_a.store.cache_files()] == [str(old)]

    # When host A prunes, then it removes the file and its row
    report = host_a.schedules.prune("nightly")
    assert (report.cache_entries, report.cache_files, report.cache_files_out_of_reach) == (0, [str(old)], [])
    assert not old.exists() and host_a.store.cache_files() == []
    for client in (host_a, host_b):
        client.store.engine.dispose()


def scheduled_namespace(client: Client, shared: Path) -> str:
    shared.mkdir(parents=True)
    pq.write_table(pa.table({"text": TEXTS}), shared / "corpus.parquet")
    client.schedules.add("nightly", cron="0 2 * * *", retention_s=2 * DAY, template={
        "mode": "embed", "model": "minilm", "input": str(shared / "corpus.parquet"), "incremental": True,
        "output": str(shared / "out" / "{date:%Y-%m-%d}")})
    job = client.schedules.run_now("nightly")
    return client.store.get_job(job.id).cache_namespace
