"""The results cache of two hosts, through the worker's own path (planning, then
queueing.worker.run_shard with the real minilm) on a real store (SQLite and PostgreSQL)
and a real S3 API server: before a move, a job on the host without the files computes
what it cannot read and leaves the shared index as it was; `barge cache move` puts the
files on S3, after which a job on the other host reuses every row; a move stopped
half-way leaves every entry readable, and finishes when run again.

Each host has its own data directory. Before the move, as with the default data
directory, their cache folders have the same path on their own disks: host A's files,
as host B sees them, are not there (moved aside while B runs).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import JobSpec
from jobs.cache_move import move_cache
from cli.main import main as barge
from jobs.client import Client
from jobs.models import resolve_model
from jobs.records import JobProgress
from jobs.settings import Settings
from queueing import planning
from queueing.app import create_app
from queueing.runtime import EngineKey, Runtime, WorkerOptions
from queueing.worker import run_shard
from storage.fs import resolve
from tests.integration.test_cache_reach import elsewhere, s3_env  # noqa: F401 (fixture)
from tests.integration.test_storage_s3 import bucket, s3_server  # noqa: F401 (fixtures)
from tests.integration.test_store import postgres_url, store_url  # noqa: F401 (fixtures)

NUM_ROWS, ROWS_PER_SHARD = 24, 12    # two shards: two cache files per job that computes


class Stopped(BaseException):
    """The move's process killed at that point."""


@dataclass
class Host:
    client: Client
    runtime: Runtime
    data_dir: Path


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    """One loaded engine for every host of the module (the key Runtime.engine_for uses)."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("loader"), database_url="sqlite://",
                        broker_url="filesystem://")
    ref = resolve_model("minilm")
    runtime = Runtime(settings=settings, store=None, app=None, models={ref.key: ref})
    return ref, runtime.engine_for(EngineKey(ref.key, "embed"))


@pytest.fixture
def shared(tmp_path, monkeypatch) -> Path:
    """The corpus and the outputs: a folder every host mounts (jobs.hosts)."""
    monkeypatch.delenv("BARGE_SINGLE_HOST", raising=False)
    monkeypatch.setenv("BARGE_SHARED_PATHS", str(tmp_path / "shared"))
    folder = tmp_path / "shared"
    folder.mkdir()
    ids = pa.array(range(NUM_ROWS), pa.int64())
    pq.write_table(pa.table({"doc_id": ids, "text": [f"Barge {i} waits at lock {i % 5}." for i in range(NUM_ROWS)]}),
                   folder / "corpus.parquet", row_group_size=ROWS_PER_SHARD)
    return folder


def start_host(tmp_path: Path, name: str, store_url: str, minilm, cache_url: str = "") -> Host:
    settings = Settings(data_dir=tmp_path / name, database_url=store_url, broker_url="filesystem://",
                        cache_url=cache_url)
    client = Client(settings=settings)
    ref, engine = minilm
    runtime = Runtime(settings=settings, store=client.store, app=create_app(settings), models={ref.key: ref},
                      options=WorkerOptions(chunk_rows=ROWS_PER_SHARD, lease_s=30.0))
    runtime.engines[EngineKey(ref.key, "embed")] = engine
    return Host(client, runtime, tmp_path / name)


def run_job(host: Host, shared: Path, output: str) -> JobProgress:
    job = host.client.submit(JobSpec(mode="embed", model="minilm", input=str(shared / "corpus.parquet"),
                                     output=str(shared / output), id_column="doc_id",
                                     max_rows_per_shard=ROWS_PER_SHARD, incremental=True))
    assert planning.plan_job(host.runtime, job.id) == NUM_ROWS // ROWS_PER_SHARD
    for shard_index in range(NUM_ROWS // ROWS_PER_SHARD):
        assert run_shard(host.runtime, job.id, shard_index).status == "committed"
    return host.client.job(job.id).status()


def cached_files(host: Host) -> list[Path]:
    return sorted((host.data_dir / "cache").glob("*/*.parquet"))


def test_a_moved_cache_serves_every_row_to_another_host(store_url, tmp_path, shared, minilm, s3_env, bucket,
                                                         monkeypatch, capsys):
    # Given host A computed a job's rows into its own cache folder
    host_a = start_host(tmp_path, "host-a", store_url, minilm)
    first = run_job(host_a, shared, "night-1")
    assert (first.rows_computed, first.rows_reused) == (NUM_ROWS, 0) and len(cached_files(host_a)) == 2

    # When `barge cache move` runs on host A
    monkeypatch.setenv("BARGE_DATABASE_URL", store_url)
    monkeypatch.setenv("BARGE_DATA_DIR", str(host_a.data_dir))
    assert barge(["cache", "move", "--to", f"{bucket}/barge-cache", "--dry-run"]) == 0
    assert "would move 2 cache files" in capsys.readouterr().out and len(cached_files(host_a)) == 2
    assert barge(["cache", "move", "--to", f"{bucket}/barge-cache"]) == 0
    printed = capsys.readouterr().out

    # Then every file is on S3, indexed there, and gone from A's disk
    assert f"moved 2 cache files to {bucket}/barge-cache; 0 on other hosts, 0 failed" in printed
    assert all(f.url.startswith(f"{bucket}/barge-cache/") for f in host_a.client.store.cache_files())
    assert cached_files(host_a) == []
    # ... and host B, writing its own cache there, reuses every row
    host_b = start_host(tmp_path, "host-b", store_url, minilm, cache_url=f"{bucket}/barge-cache")
    with elsewhere(host_a.data_dir):
        second = run_job(host_b, shared, "night-2")
    assert (second.rows_computed, second.rows_reused) == (0, NUM_ROWS)


def test_a_stopped_move_leaves_every_entry_readable_and_finishes_when_run_again(store_url, tmp_path, shared, minilm,
                                                                               s3_env, bucket, monkeypatch):
    host_a = start_host(tmp_path, "host-a", store_url, minilm)
    run_job(host_a, shared, "night-1")
    originals = [str(path) for path in cached_files(host_a)]

    # Given a move killed after re-pointing the first file, before removing its original
    import jobs.cache_move

    def killed(url: str) -> None:
        raise Stopped(url)
    with monkeypatch.context() as patch:
        patch.setattr(jobs.cache_move, "_remove", killed)
        with pytest.raises(Stopped):
            move_cache(host_a.client.store, str(host_a.data_dir / "cache"), f"{bucket}/barge-cache")

    # Then one entry names its copy and one its original, both whole; both originals are still there
    urls = sorted(f.url for f in host_a.client.store.cache_files())
    assert [url.startswith("s3://") for url in urls] == [False, True]
    for url in urls:
        fs, path = resolve(url)
        with fs.open(path, "rb") as file:
            assert pq.read_table(file).num_rows > 0
    assert [str(path) for path in cached_files(host_a)] == originals

    # When the move runs again, then it moves the other file and sweeps the copied original
    report = move_cache(host_a.client.store, str(host_a.data_dir / "cache"), f"{bucket}/barge-cache")
    assert (len(report.moved), len(report.swept), report.failed) == (1, 1, [])
    assert "its copy is indexed already" in "\n".join(report.lines())
    assert cached_files(host_a) == []
    assert all(f.url.startswith(f"{bucket}/barge-cache/") for f in host_a.client.store.cache_files())
    host_b = start_host(tmp_path, "host-b", store_url, minilm, cache_url=f"{bucket}/barge-cache")
    with elsewhere(host_a.data_dir):
        assert run_job(host_b, shared, "night-2").rows_reused == NUM_ROWS


def test_before_a_move_the_other_host_computes_its_rows_and_the_index_stays(postgres_url, tmp_path, shared, minilm,
                                                                            caplog):
    # Given host A cached a job's rows in its cache folder (PostgreSQL: a deployment of many hosts)
    cache_folder = str(tmp_path / "cache")
    host_a = start_host(tmp_path, "host-a", postgres_url, minilm, cache_url=cache_folder)
    run_job(host_a, shared, "night-1")
    indexed = sorted(f.url for f in host_a.client.store.cache_files())
    [namespace_folder] = (tmp_path / "cache").iterdir()

    # When host B, its cache folder at the same path, runs the job again
    host_b = start_host(tmp_path, "host-b", postgres_url, minilm, cache_url=cache_folder)
    with elsewhere(namespace_folder), caplog.at_level(logging.WARNING, logger="barge.worker"):
        on_b = run_job(host_b, shared, "night-2")
        assert not namespace_folder.exists(), "B wrote no cache file of rows the index has from A"

    # Then B computes every row, says so once per shard, counts them, and the index is as it was
    assert (on_b.rows_computed, on_b.rows_reused) == (NUM_ROWS, 0)
    warnings = [r.getMessage() for r in caplog.records if "cache files this host cannot read" in r.getMessage()]
    assert len(warnings) == NUM_ROWS // ROWS_PER_SHARD
    assert host_b.runtime.metrics.registry.get_sample_value("barge_cache_unreadable_total") == NUM_ROWS
    assert sorted(f.url for f in host_b.client.store.cache_files()) == indexed
    # ... and A, where the files are, still reuses every row
    assert run_job(host_a, shared, "night-3").rows_reused == NUM_ROWS
