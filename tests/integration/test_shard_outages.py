"""A shard attempt that meets an outage is retried uncounted; one that fails for its own
reasons counts toward dead-lettering (queueing.worker._handle_failure), on a real SQLite
store and the embedded broker's real queue folder.

Given a shard on its last allowed attempt, when the attempt fails on a database or S3
outage, then the shard goes back to PENDING with the attempt given back and is sent again;
when it fails on a bad input, then it is dead-lettered and the job is ready to finalize."""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import exc as sa_exc

from jobs.settings import Settings
from jobs.status import ShardStatus
from jobs.store import Store
from queueing.app import create_app
from queueing.runtime import Runtime, WorkerOptions
from queueing.worker import _handle_failure
from storage.errors import InputError
from tests.integration.test_store import make_plans, new_job


@pytest.fixture
def runtime(tmp_path):
    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'barge.db'}",
                        broker_url="filesystem://")
    store = Store(settings.database_url)
    store.migrate()
    yield Runtime(settings=settings, store=store, app=create_app(settings), options=WorkerOptions(max_attempts=2))
    store.engine.dispose()


def shard_on_last_attempt(runtime: Runtime) -> tuple[str, object]:
    store = runtime.store
    job_id = new_job(store)
    assert store.start_job(job_id, make_plans(1))
    first = store.claim_shard(job_id, 0)
    assert store.release_shard(job_id, 0, first.token, "lost once")
    last = store.claim_shard(job_id, 0)
    assert last.attempt == runtime.options.max_attempts
    return job_id, last


def queued_messages(runtime: Runtime) -> int:
    return len(list((runtime.settings.broker_dir / "queue").glob("*.msg")))


def read_reset_by_peer() -> InputError:
    """What storage raises when S3 drops the connection past the client's retries: the
    backend's error is its cause, and says the error passes."""
    error = InputError("s3://corpus/a.parquet: cannot read shard 0 (connection reset)")
    error.__cause__ = ConnectionResetError(104, "Connection reset by peer")
    return error


@pytest.mark.parametrize("outage", [
    sa_exc.OperationalError("UPDATE barge_shards", None, sqlite3.OperationalError("database is locked")),
    read_reset_by_peer(),
])
def test_an_outage_gives_the_attempt_back(runtime, outage):
    job_id, claim = shard_on_last_attempt(runtime)
    job = runtime.store.get_job(job_id)
    assert _handle_failure(runtime, job, 0, claim, outage).status == "retrying"
    [shard] = runtime.store.list_shards(job_id)
    assert shard.status == ShardStatus.PENDING
    assert shard.attempt == claim.attempt - 1, "the outage did not use up an attempt"
    assert queued_messages(runtime) == 1, "sent again"


def test_a_bad_input_on_the_last_attempt_is_dead_lettered(runtime):
    job_id, claim = shard_on_last_attempt(runtime)
    job = runtime.store.get_job(job_id)
    error = InputError("a.parquet: columns ['text'] are not in the file")
    assert _handle_failure(runtime, job, 0, claim, error).status == "failed"
    [shard] = runtime.store.list_shards(job_id)
    assert shard.status == ShardStatus.FAILED
    assert "not in the file" in shard.error
