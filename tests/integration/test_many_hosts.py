"""One host or many (issue 46, jobs.hosts): with a shared store and a network broker,
every location a job or a process depends on must be reachable from every host. A local
input, output or model folder is refused at submit naming the field; a local results
cache refuses `barge worker` at start, the API's default files folder `barge serve`, each
naming its setting; object-store URLs and paths under BARGE_SHARED_PATHS pass; the
embedded default and BARGE_SINGLE_HOST=1 are one host, where local paths are fine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import JobSpec, JobSpecError
from jobs.client import Client
from jobs.hosts import is_single_host, unshared
from jobs.settings import Settings
from tests.support.stack import free_port

pytestmark = pytest.mark.postgres
REPO = Path(__file__).resolve().parents[2]
MANY = {"BARGE_DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/test",
        "BARGE_BROKER_URL": "amqp://guest:guest@127.0.0.1:5672//", "BARGE_SINGLE_HOST": "0"}


def settings_for(env: dict[str, str], tmp_path: Path) -> Settings:
    return Settings.from_env({"BARGE_DATA_DIR": str(tmp_path / "data"), **env})


def test_which_deployments_are_one_host(tmp_path):
    embedded = settings_for({}, tmp_path)
    many = settings_for(MANY, tmp_path)
    assert is_single_host(embedded, {}) and not is_single_host(many, MANY)
    assert is_single_host(many, {**MANY, "BARGE_SINGLE_HOST": "1"})
    assert unshared("/tmp/corpus", embedded, {}) is None
    assert "BARGE_SHARED_PATHS" in unshared("/tmp/corpus", many, MANY)
    assert "memory" in unshared("memory://scratch/out", many, MANY)
    for url in ("s3://bucket/corpus/", "gs://b/x", "https://host/data.parquet"):
        assert unshared(url, many, MANY) is None
    shared = {**MANY, "BARGE_SHARED_PATHS": f"/mnt/corpus{os.pathsep}{tmp_path}"}
    assert unshared(str(tmp_path / "corpus" / "a.parquet"), many, shared) is None
    assert unshared(f"file://{tmp_path}/out", many, shared) is None
    assert unshared("/mnt/corpus-other/x", many, shared) is not None   # a prefix of a name is not a parent


def test_a_local_input_output_or_model_folder_is_refused_at_submit_naming_the_field(tmp_path, monkeypatch):
    for name, value in MANY.items():
        monkeypatch.setenv(name, value)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    pq.write_table(pa.table({"text": ["a", "b"]}), corpus / "part.parquet")
    client = Client(settings=settings_for(MANY, tmp_path))
    with pytest.raises(JobSpecError) as refused:
        client.submit(JobSpec(mode="embed", model="minilm", input=str(corpus), output="s3://bucket/out/"))
    assert refused.value.field == "input" and "this host's disk" in str(refused.value)
    with pytest.raises(JobSpecError) as refused:
        client.submit(JobSpec(mode="embed", model="minilm", input="s3://bucket/corpus/", output=str(tmp_path / "out")))
    assert refused.value.field == "output"
    from jobs.models import registered_models
    model_folder = registered_models()["minilm"]
    with pytest.raises(JobSpecError) as refused:
        client.submit(JobSpec(mode="embed", model=model_folder, input="s3://bucket/c/", output="s3://bucket/out/"))
    assert refused.value.field == "model" and "registered on the workers" in str(refused.value)


def _barge(argv: list[str], env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *argv], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "BARGE_DATA_DIR": str(tmp_path / "data"), **env}, timeout=120)


def test_a_worker_and_a_server_with_host_local_locations_refuse_to_start_naming_the_setting(tmp_path):
    worker = _barge(["worker", "--model", "minilm"], MANY, tmp_path)
    assert worker.returncode == 1 and "BARGE_CACHE_URL" in worker.stderr and "s3://" in worker.stderr, worker.stderr
    server = _barge(["serve", "--port", str(free_port())], MANY, tmp_path)
    assert server.returncode == 1 and "BARGE_API_FILES_URL" in server.stderr, server.stderr
    # The same settings pass once they name shared locations (checked without starting the processes).
    from jobs.hosts import check_setting
    shared = {**MANY, "BARGE_SHARED_PATHS": str(tmp_path / "shared")}
    many = settings_for(MANY, tmp_path)
    check_setting("BARGE_CACHE_URL", "s3://bucket/barge-cache", many, shared)
    check_setting("BARGE_API_FILES_URL", str(tmp_path / "shared" / "api"), many, shared)
    with pytest.raises(ValueError, match="BARGE_CACHE_URL"):
        check_setting("BARGE_CACHE_URL", many.cache_url, many, shared)


def test_a_schedule_with_host_local_locations_is_refused_and_a_beat_will_not_start_over_one(tmp_path, monkeypatch):
    from jobs.schedules import ScheduleError
    client = Client(settings=settings_for(MANY, tmp_path))
    template = {"mode": "embed", "model": "minilm", "input": "s3://bucket/corpus/{date:%Y-%m-%d}/",
                "output": str(tmp_path / "nightly" / "{date:%Y-%m-%d}")}
    monkeypatch.setenv("BARGE_SINGLE_HOST", "0")
    with pytest.raises(ScheduleError) as refused:
        client.schedules.add("nightly-local", cron="0 2 * * *", template=template)
    assert refused.value.field == "template.output"
    # One added while the deployment was one host is caught when a beat starts.
    monkeypatch.setenv("BARGE_SINGLE_HOST", "1")
    client.schedules.add("nightly-local", cron="0 2 * * *", template=template)
    env = {"BARGE_DATABASE_URL": MANY["BARGE_DATABASE_URL"], "BARGE_BROKER_URL": MANY["BARGE_BROKER_URL"],
           "BARGE_SINGLE_HOST": "0"}
    try:
        beat = _barge(["beat", "--once"], env, tmp_path)
        assert beat.returncode == 1 and "schedule 'nightly-local': template.output" in beat.stderr, beat.stderr
    finally:
        client.schedules.remove("nightly-local")
