"""The SQL store on real databases: a fresh SQLite file and a fresh PostgreSQL schema per test.

Given a job in some state, when a worker or the finalizer calls the store, then the
state machine, the fencing tokens and the outbox hold on both databases alike.
"""

from __future__ import annotations

import functools
import json
import threading
import time
import uuid

import pytest
import sqlalchemy as sa

from jobs.events import final_event
from jobs.spec import JobSpec
from jobs.status import InvalidTransition, JobStatus, ShardStatus
from jobs.outbox import OutboxEvent
from jobs.store import PARTIAL_OUTPUT_HOLD_S, Store

POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
OUTPUT_SCHEMA = "encoded-schema"   # the store keeps it as opaque text


@functools.cache
def postgres_unreachable_reason() -> str | None:
    engine = sa.create_engine(POSTGRES_URL, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except Exception as error:  # noqa: BLE001 - any failure means: no server to test against
        return f"PostgreSQL at {POSTGRES_URL} is not reachable: {type(error).__name__}: {error}"
    finally:
        engine.dispose()
    return None


@pytest.fixture
def postgres_url():
    reason = postgres_unreachable_reason()
    if reason:
        pytest.skip(reason)
    schema = f"barge_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(POSTGRES_URL)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        # Every connection of the store sees only this test's schema.
        yield f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state' / 'barge.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def store(store_url):
    store = Store(store_url)
    store.migrate()
    yield store
    store.engine.dispose()


def make_spec(**changes) -> JobSpec:
    fields = dict(mode="embed", model="minilm", input=["/in/a.parquet", "/in/b.parquet"], output="/out/",
                  id_column="doc_id", webhook_url="https://example.com/hooks/barge", metadata={"night": 1})
    return JobSpec(**{**fields, **changes})


def make_plans(num_shards: int, num_rows: int = 10) -> list[dict]:
    return [dict(shard_index=i, file_index=0, url="/in/a.parquet", row_groups=[i], row_start=i * num_rows,
                 num_rows=num_rows) for i in range(num_shards)]


def new_job(store: Store, **changes) -> str:
    return store.create_job(make_spec(**changes), model_key="all-MiniLM-L6-v2", rows_total=30,
                            output_schema=OUTPUT_SCHEMA, webhook_secret="whsec_test")


def running_job(store: Store, num_shards: int = 3) -> str:
    job_id = new_job(store)
    assert store.start_job(job_id, make_plans(num_shards))
    return job_id


def part(shard_index: int) -> dict:
    return dict(name=f"part-00000-{shard_index:05d}.parquet", num_rows=10, num_bytes=100, sha256="0" * 64)


def commit(store: Store, job_id: str, shard_index: int, token: str, rows_failed: int = 0) -> tuple[bool, bool]:
    return store.commit_shard(job_id, shard_index, token, part=part(shard_index),
                              rows_succeeded=10 - rows_failed, rows_failed=rows_failed)


def shard_statuses(store: Store, job_id: str) -> list[ShardStatus]:
    return [shard.status for shard in store.list_shards(job_id)]


def outbox_event(job_id: str) -> OutboxEvent:
    return OutboxEvent(id=f"msg_{uuid.uuid4().hex}", type="job.failed", url="https://example.com/hooks/barge",
                       body=json.dumps({"job_id": job_id}).encode())


# --- schema ---------------------------------------------------------------------------


def head_revision() -> str:
    from alembic.script import ScriptDirectory
    from jobs.store import MIGRATIONS
    return ScriptDirectory(str(MIGRATIONS)).get_current_head()


def test_migrate_twice_is_idempotent(store, store_url):
    new_job(store)
    store.migrate()
    again = Store(store_url)
    again.migrate()
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all() == [head_revision()]
    assert len(again.list_jobs()) == 1   # nothing dropped or recreated
    again.engine.dispose()


# --- jobs -----------------------------------------------------------------------------


def test_create_and_get_a_job(store):
    spec = make_spec()
    before = time.time()
    job_id = store.create_job(spec, model_key="all-MiniLM-L6-v2", rows_total=30, output_schema=OUTPUT_SCHEMA,
                              webhook_secret="whsec_abc")
    job = store.get_job(job_id)
    assert job.id == job_id and len(job_id) == 32
    assert job.status == JobStatus.QUEUED
    assert job.spec == spec
    assert (job.model_key, job.rows_total, job.output_schema) == ("all-MiniLM-L6-v2", 30, OUTPUT_SCHEMA)
    assert job.error is None and job.started_at is None and job.finished_at is None
    assert before <= job.created_at <= time.time()
    assert store.webhook_secrets(job_id) == ["whsec_abc"]
    assert store.list_shards(job_id) == []


def test_an_fp8_check_is_stored_with_the_job_and_replaced_by_a_later_attempt(store):
    job_id = new_job(store)
    assert store.quant_check(job_id) is None
    figures = {"mode": "embed", "quantization": "fp8", "baseline_dtype": "float32", "num_rows": 64,
               "cosine_mean": 0.99836, "cosine_min": 0.99749}
    store.record_quant_check(job_id, {"error": "RuntimeError: out of memory"})
    store.record_quant_check(job_id, figures)
    assert store.quant_check(job_id) == figures
    assert store.quant_check(new_job(store)) is None     # one job's check only


def test_an_unknown_job_is_a_key_error(store):
    with pytest.raises(KeyError):
        store.get_job("0" * 32)
    with pytest.raises(KeyError):
        store.start_job("0" * 32, make_plans(1))


def test_list_jobs_newest_first(store):
    job_ids = [new_job(store) for _ in range(3)]
    assert [job.id for job in store.list_jobs()] == job_ids[::-1]
    assert [job.id for job in store.list_jobs(limit=2)] == job_ids[:0:-1]


def test_start_job_plans_shards_once(store):
    job_id = new_job(store)
    assert store.start_job(job_id, make_plans(3))
    job = store.get_job(job_id)
    assert job.status == JobStatus.RUNNING and job.started_at >= job.created_at
    shards = store.list_shards(job_id)
    assert [s.shard_index for s in shards] == [0, 1, 2]
    assert all(s.status == ShardStatus.PENDING and s.attempt == 0 and s.token is None for s in shards)
    assert shards[1].plan == make_plans(3)[1]
    assert shards[1].num_rows == 10
    # A redelivered plan task finds the job already running.
    assert not store.start_job(job_id, make_plans(5))
    assert len(store.list_shards(job_id)) == 3
    assert store.get_job(job_id).started_at == job.started_at


# --- shards: claim, commit, fencing ---------------------------------------------------


def test_claim_then_redelivery_fences_the_stale_attempt(store):
    job_id = running_job(store, num_shards=1)
    first = store.claim_shard(job_id, 0, worker_id="w1", lease_s=0.5)
    assert first.attempt == 1 and first.plan == make_plans(1)[0]
    # A redelivered message while the first worker's lease is live is dropped.
    assert store.claim_shard(job_id, 0, worker_id="w2") is None
    assert store.renew_lease(job_id, 0, first.token, lease_s=0.5)
    time.sleep(0.6)
    # The lease ran out (the first worker looks dead): a new attempt takes over.
    second = store.claim_shard(job_id, 0, worker_id="w2")
    assert second.attempt == 2 and second.token != first.token
    assert not store.renew_lease(job_id, 0, first.token), "the stale attempt learns it lost the shard"
    assert store.list_shards(job_id)[0].worker_id == "w2"
    assert commit(store, job_id, 0, first.token) == (False, False)
    assert store.fail_shard(job_id, 0, first.token, "late") == (False, False)
    assert not store.release_shard(job_id, 0, first.token, "late")
    assert store.list_shards(job_id)[0].status == ShardStatus.RUNNING
    assert commit(store, job_id, 0, second.token) == (True, True)
    shard = store.list_shards(job_id)[0]
    assert shard.status == ShardStatus.COMMITTED and shard.token == second.token
    assert shard.part == part(0) and (shard.rows_succeeded, shard.rows_failed) == (10, 0)
    # A finished shard is neither claimed nor committed again.
    assert store.claim_shard(job_id, 0) is None
    assert commit(store, job_id, 0, second.token) == (False, False)


def test_claim_needs_a_running_job(store):
    job_id = new_job(store)
    assert store.claim_shard(job_id, 0) is None          # not planned yet
    job_id = running_job(store)
    with pytest.raises(KeyError):
        store.claim_shard(job_id, 99)


def test_commit_reports_ready_once_for_the_last_shard(store):
    job_id = running_job(store, num_shards=3)
    claims = [store.claim_shard(job_id, i) for i in range(3)]
    results = [commit(store, job_id, i, claims[i].token) for i in (2, 0, 1)]
    assert results == [(True, False), (True, False), (True, True)]
    assert shard_statuses(store, job_id) == [ShardStatus.COMMITTED] * 3


def test_fail_shard_finishes_it_and_can_make_the_job_ready(store):
    job_id = running_job(store, num_shards=2)
    claims = [store.claim_shard(job_id, i) for i in range(2)]
    assert store.fail_shard(job_id, 0, claims[0].token, "CUDA error: out of memory") == (True, False)
    assert store.fail_shard(job_id, 0, claims[0].token, "twice") == (False, False)
    assert commit(store, job_id, 1, claims[1].token) == (True, True)
    failed = store.list_shards(job_id)[0]
    assert failed.status == ShardStatus.FAILED and failed.error == "CUDA error: out of memory"
    assert store.claim_shard(job_id, 0) is None


def test_release_gives_the_shard_back_for_another_attempt(store):
    job_id = running_job(store, num_shards=1)
    first = store.claim_shard(job_id, 0)
    assert store.release_shard(job_id, 0, first.token, "connection reset")
    shard = store.list_shards(job_id)[0]
    assert (shard.status, shard.token, shard.error, shard.attempt) == (ShardStatus.PENDING, None,
                                                                      "connection reset", 1)
    assert not store.release_shard(job_id, 0, first.token, "again")
    assert commit(store, job_id, 0, first.token) == (False, False)
    second = store.claim_shard(job_id, 0)
    assert second.attempt == 2
    assert store.list_shards(job_id)[0].error is None     # a new attempt starts clean
    assert commit(store, job_id, 0, second.token) == (True, True)


# --- finalize, finish, cancel ---------------------------------------------------------


def test_begin_finalize_only_when_every_shard_is_finished(store):
    job_id = new_job(store)
    assert not store.begin_finalize(job_id)                  # still queued
    store.start_job(job_id, make_plans(2))
    claims = [store.claim_shard(job_id, i) for i in range(2)]
    assert not store.begin_finalize(job_id)                  # both running
    commit(store, job_id, 0, claims[0].token)
    assert not store.begin_finalize(job_id)                  # one running
    store.fail_shard(job_id, 1, claims[1].token, "bad")
    assert store.begin_finalize(job_id)
    assert store.get_job(job_id).status == JobStatus.FINALIZING
    # A redelivered or re-driven finalize re-enters (its owner's: jobs.recovery_store);
    # finalizing is idempotent, and once the job is final nothing re-enters.
    assert store.begin_finalize(job_id)
    assert store.finish_job(job_id, JobStatus.FAILED)
    assert not store.begin_finalize(job_id)


def test_a_job_without_shards_can_finalize_at_once(store):
    job_id = new_job(store)
    assert store.start_job(job_id, [])
    assert store.begin_finalize(job_id)


def test_finish_job_writes_the_outbox_row_with_the_state(store):
    job_id = running_job(store, num_shards=2)
    for i in range(2):
        commit(store, job_id, i, store.claim_shard(job_id, i).token, rows_failed=i)
    assert store.begin_finalize(job_id)
    event = final_event(store, job_id, JobStatus.SUCCEEDED, None)
    assert store.finish_job(job_id, JobStatus.SUCCEEDED, event=event)
    job = store.get_job(job_id)
    assert job.status == JobStatus.SUCCEEDED and job.finished_at >= job.started_at
    [row] = store.outbox.events(job_id)
    assert (row.id, row.type, row.url, row.body) == (event.id, "job.succeeded", event.url, event.body)
    assert (row.status, row.attempts, row.last_status_code, row.last_error) == ("pending", 0, None, None)
    data = json.loads(row.body)["data"]
    assert data["status"] == "succeeded"
    assert data["rows"] == {"total": 30, "succeeded": 19, "failed": 1}
    assert data["output"] == "/out/" and data["manifest_url"] == "/out/_manifest.json"
    assert data["metadata"] == {"night": 1}
    # A second final state is refused and writes nothing.
    assert not store.finish_job(job_id, JobStatus.FAILED, error="late", event=outbox_event(job_id))
    assert store.get_job(job_id).status == JobStatus.SUCCEEDED and store.get_job(job_id).error is None
    assert len(store.outbox.events(job_id)) == 1


def test_no_webhook_url_no_event(store):
    job_id = new_job(store, webhook_url=None)
    assert final_event(store, job_id, JobStatus.FAILED, "planning failed") is None


def test_finish_job_state_and_outbox_are_one_transaction(store):
    first, second = running_job(store), running_job(store)
    event = outbox_event(first)
    assert store.finish_job(first, JobStatus.FAILED, error="boom", event=event)
    # The same event id again: the outbox insert fails, so the state change rolls back too.
    with pytest.raises(sa.exc.IntegrityError):
        store.finish_job(second, JobStatus.FAILED, error="boom", event=event)
    assert store.get_job(second).status == JobStatus.RUNNING
    assert store.get_job(second).error is None


def test_finish_job_refuses_a_transition_the_state_machine_forbids(store):
    job_id = new_job(store)
    with pytest.raises(InvalidTransition):
        store.finish_job(job_id, JobStatus.SUCCEEDED, event=outbox_event(job_id))   # queued -> succeeded
    assert store.get_job(job_id).status == JobStatus.QUEUED
    assert store.outbox.events(job_id) == []
    assert store.finish_job(job_id, JobStatus.FAILED, error="no input files")
    assert store.get_job(job_id).error == "no input files"


def test_cancel_stops_pending_and_running_shards(store):
    job_id = running_job(store, num_shards=3)
    committed, running = store.claim_shard(job_id, 0), store.claim_shard(job_id, 1)
    commit(store, job_id, 0, committed.token)
    event = final_event(store, job_id, JobStatus.CANCELLED, None)
    assert store.finish_job(job_id, JobStatus.CANCELLED, event=event)
    assert shard_statuses(store, job_id) == [ShardStatus.COMMITTED, ShardStatus.CANCELLED, ShardStatus.CANCELLED]
    # The worker still running shard 1 finishes after the cancel: its commit is refused.
    assert commit(store, job_id, 1, running.token) == (False, False)
    assert not store.release_shard(job_id, 1, running.token, "x")
    assert store.claim_shard(job_id, 2) is None
    assert not store.begin_finalize(job_id)
    assert not store.finish_job(job_id, JobStatus.CANCELLED)
    assert [e.type for e in store.outbox.events(job_id)] == ["job.cancelled"]
    assert json.loads(store.outbox.events(job_id)[0].body)["data"]["output"] is None


def test_cancel_a_queued_job(store):
    job_id = new_job(store)
    assert store.finish_job(job_id, JobStatus.CANCELLED)
    assert not store.start_job(job_id, make_plans(2))
    assert store.list_shards(job_id) == []


# --- progress -------------------------------------------------------------------------


def test_progress_counts_shards_and_rows(store):
    job_id = new_job(store)
    progress = store.progress(job_id)
    assert (progress.status, progress.shards, progress.rows_done) == (JobStatus.QUEUED, {}, 0)
    store.start_job(job_id, make_plans(5))
    claims = {i: store.claim_shard(job_id, i) for i in range(4)}
    commit(store, job_id, 0, claims[0].token, rows_failed=2)
    commit(store, job_id, 1, claims[1].token, rows_failed=0)
    store.fail_shard(job_id, 2, claims[2].token, "bad")
    progress = store.progress(job_id)
    assert progress.shards == {"pending": 1, "running": 1, "committed": 2, "failed": 1}
    assert (progress.rows_total, progress.rows_succeeded, progress.rows_failed) == (30, 18, 2)
    assert progress.rows_done == 20
    assert progress.output == "/out/"
    assert not progress.is_finished
    store.finish_job(job_id, JobStatus.CANCELLED)
    progress = store.progress(job_id)
    assert progress.is_finished and progress.shards == {"committed": 2, "failed": 1, "cancelled": 2}


# --- webhook outbox -------------------------------------------------------------------


@pytest.fixture
def queued_event(store):
    job_id = new_job(store)    # failed in planning: no partial manifest owed, its event is due at once
    event = outbox_event(job_id)
    store.finish_job(job_id, JobStatus.FAILED, error="boom", event=event)
    return event


def test_an_event_is_due_and_claimed_once(store, queued_event):
    assert store.outbox.due() == [queued_event.id]
    record = store.outbox.claim(queued_event.id)
    assert (record.id, record.body, record.status, record.attempts) == (queued_event.id, queued_event.body,
                                                                        "pending", 1)
    assert store.outbox.claim(queued_event.id) is None          # another dispatcher
    assert store.outbox.due() == []
    assert store.outbox.due(now=time.time() + 300) == [queued_event.id]   # the lease ran out
    [attempt] = store.outbox.attempts(queued_event.id)
    assert (attempt.attempt, attempt.finished_at, attempt.status_code) == (1, None, None)


def test_an_expired_lease_can_be_claimed_again(store, queued_event):
    assert store.outbox.claim(queued_event.id, lease_s=0.0) is not None
    assert store.outbox.claim(queued_event.id).attempts == 2
    assert [a.attempt for a in store.outbox.attempts(queued_event.id)] == [1, 2]


def test_a_delivered_event_is_done(store, queued_event):
    record = store.outbox.claim(queued_event.id)
    store.outbox.record(queued_event.id, record.attempts, ok=True, status_code=204, error=None, latency_s=0.05,
                        next_attempt_at=None)
    [row] = store.outbox.events(store.list_jobs()[0].id)
    assert (row.status, row.attempts, row.last_status_code, row.last_error) == ("delivered", 1, 204, None)
    assert row.delivered_at is not None
    [attempt] = store.outbox.attempts(queued_event.id)
    assert (attempt.status_code, attempt.latency_s, attempt.error) == (204, 0.05, None)
    assert attempt.finished_at >= attempt.started_at
    assert store.outbox.due(now=time.time() + 10_000) == []
    assert store.outbox.claim(queued_event.id) is None


def test_a_failed_attempt_is_due_again_later(store, queued_event):
    store.outbox.claim(queued_event.id)
    retry_at = time.time() + 60
    store.outbox.record(queued_event.id, 1, ok=False, status_code=503, error="HTTP 503", latency_s=0.1,
                        next_attempt_at=retry_at)
    [row] = store.outbox.events(store.list_jobs()[0].id)
    assert (row.status, row.attempts, row.last_status_code, row.last_error) == ("pending", 1, 503, "HTTP 503")
    assert row.next_attempt_at == pytest.approx(retry_at)
    assert store.outbox.due() == []
    assert store.outbox.due(now=retry_at) == [queued_event.id]
    assert store.outbox.claim(queued_event.id) is None            # not due yet
    store.outbox.record(queued_event.id, 1, ok=False, status_code=None, error="timed out", latency_s=1.0,
                        next_attempt_at=time.time())
    assert store.outbox.due() == [queued_event.id]
    assert store.outbox.claim(queued_event.id).attempts == 2


def test_a_stale_attempt_does_not_move_the_event(store, queued_event):
    # Given attempt 1 outlived its lease and attempt 2 took the event over,
    store.outbox.claim(queued_event.id, lease_s=0.0)
    store.outbox.claim(queued_event.id)
    # when attempt 1 finally records a failure, then only its own attempt row changes.
    store.outbox.record(queued_event.id, 1, ok=False, status_code=500, error="HTTP 500", latency_s=9.0,
                        next_attempt_at=None)
    assert store.outbox.event(queued_event.id).status == "pending"
    store.outbox.record(queued_event.id, 2, ok=True, status_code=200, error=None, latency_s=0.1,
                        next_attempt_at=None)
    assert store.outbox.event(queued_event.id).status == "delivered"
    assert [a.status_code for a in store.outbox.attempts(queued_event.id)] == [500, 200]


def test_an_exhausted_event_fails_for_good(store, queued_event):
    store.outbox.claim(queued_event.id)
    store.outbox.record(queued_event.id, 1, ok=False, status_code=500, error="HTTP 500", latency_s=0.1,
                        next_attempt_at=None)
    [row] = store.outbox.events(store.list_jobs()[0].id)
    assert (row.status, row.attempts, row.last_status_code) == ("failed", 1, 500)
    assert store.outbox.due(now=time.time() + 10_000) == []
    assert store.outbox.claim(queued_event.id) is None


def test_replay_makes_a_finished_event_due_with_a_fresh_budget(store, queued_event):
    store.outbox.claim(queued_event.id)
    store.outbox.record(queued_event.id, 1, ok=True, status_code=200, error=None, latency_s=0.1,
                        next_attempt_at=None)
    replayed = store.outbox.replay(queued_event.id)
    assert (replayed.status, replayed.attempts, replayed.retry_from, replayed.delivered_at) == ("pending", 1, 1, None)
    assert store.outbox.due() == [queued_event.id]
    assert store.outbox.claim(queued_event.id).attempts == 2
    with pytest.raises(ValueError, match="being delivered"):
        store.outbox.replay(queued_event.id)      # in flight
    with pytest.raises(KeyError):
        store.outbox.replay("msg_nope")


def test_410_disables_the_endpoint_and_holds_later_events(store, queued_event):
    store.outbox.claim(queued_event.id)
    store.outbox.record(queued_event.id, 1, ok=False, status_code=410, error="HTTP 410 Gone", latency_s=0.1,
                        next_attempt_at=None, disable_endpoint=True)
    [endpoint] = store.outbox.endpoints()
    assert endpoint.url == queued_event.url and endpoint.disabled_at and queued_event.id in endpoint.disabled_reason
    later_job_id = new_job(store)
    later = outbox_event(later_job_id)
    store.finish_job(later_job_id, JobStatus.FAILED, event=later)
    assert store.outbox.claim(later.id) is None
    assert store.outbox.event(later.id).status == "disabled"
    assert store.outbox.attempts(later.id) == []
    assert store.outbox.enable_endpoint(queued_event.url) == 1
    assert store.outbox.endpoints()[0].disabled_at is None
    assert store.outbox.claim(later.id).attempts == 1


def test_shard_commit_writes_its_events_in_the_same_transaction(store):
    job_id = running_job(store, num_shards=3)
    seen = []

    def events(commit):
        seen.append(commit)
        return [outbox_event(job_id)]

    token = store.claim_shard(job_id, 1).token
    assert commit(store, job_id, 1, token, rows_failed=2) == (True, False)   # no events asked for
    store.commit_shard(job_id, 1, token, part=part(1), rows_succeeded=10, rows_failed=0, events=events)  # stale
    token = store.claim_shard(job_id, 0).token
    store.commit_shard(job_id, 0, token, part=part(0), rows_succeeded=9, rows_failed=1, events=events)
    [committed] = seen
    assert (committed.shard_index, committed.rows_succeeded, committed.rows_failed) == (0, 9, 1)
    assert (committed.shards_total, committed.shards_finished) == (3, 2)
    assert (committed.job_rows_succeeded, committed.job_rows_failed) == (17, 3)
    assert committed.part_name == part(0)["name"]
    assert len(store.outbox.events(job_id)) == 1


def test_a_job_past_its_deadline_is_listed_as_expired(store):
    job_id = new_job(store, expires_after_s=60)
    assert store.expired_jobs() == []
    assert store.expired_jobs(now=time.time() + 61) == [job_id]
    assert store.start_job(job_id, make_plans(2))
    assert store.expired_jobs(now=time.time() + 61) == [job_id]
    assert store.finish_job(job_id, JobStatus.EXPIRED, error="late")
    assert store.expired_jobs(now=time.time() + 61) == []
    assert shard_statuses(store, job_id) == [ShardStatus.CANCELLED, ShardStatus.CANCELLED]


@pytest.mark.parametrize("status", [JobStatus.EXPIRED, JobStatus.CANCELLED, JobStatus.FAILED])
def test_a_planned_job_that_ends_unfinished_owes_its_partial_manifest_until_written(store, status):
    job_id = running_job(store, num_shards=2)
    assert store.finish_job(job_id, status, error="ended")
    soon, later = time.time() + 5, time.time() + 61
    assert store.stale_partial_outputs(60, now=soon) == []          # its task was sent just now
    assert store.stale_partial_outputs(60, now=later) == [job_id]   # and nothing wrote the manifest since
    store.touch_partial_output(job_id, now=later)                   # sent again
    assert store.stale_partial_outputs(60, now=later) == []
    assert store.stale_partial_outputs(60, now=later + 61) == [job_id]
    # Not chased for ever: a day after the job ended it is left be.
    assert store.stale_partial_outputs(60, now=time.time() + 86_401) == []
    store.partial_output_written(job_id)
    assert store.stale_partial_outputs(60, now=later + 61) == []


def test_a_retried_job_owes_no_partial_manifest_until_it_ends_unfinished_again(store):
    job_id = running_job(store, num_shards=2)
    assert store.finish_job(job_id, JobStatus.CANCELLED)
    assert store.retry_job(job_id) == JobStatus.RUNNING
    assert store.stale_partial_outputs(60, now=time.time() + 61) == []
    assert store.finish_job(job_id, JobStatus.EXPIRED, error="late")
    assert store.stale_partial_outputs(60, now=time.time() + 61) == [job_id]


def test_a_succeeded_or_never_planned_job_owes_no_partial_manifest(store):
    succeeded, unplanned = running_job(store, num_shards=1), new_job(store)
    commit(store, succeeded, 0, store.claim_shard(succeeded, 0).token)
    assert store.begin_finalize(succeeded)
    assert store.finish_job(succeeded, JobStatus.SUCCEEDED)
    assert store.finish_job(unplanned, JobStatus.FAILED, error="planning failed")
    assert store.stale_partial_outputs(60, now=time.time() + 61) == []


def test_an_unfinished_jobs_webhook_waits_for_its_partial_manifest(store):
    job_id = running_job(store, num_shards=2)
    event = outbox_event(job_id)
    assert store.finish_job(job_id, JobStatus.EXPIRED, error="late", event=event)
    assert store.outbox.due() == [] and store.outbox.claim(event.id) is None
    # A manifest that cannot be written holds it no longer than PARTIAL_OUTPUT_HOLD_S.
    assert store.outbox.due(now=time.time() + PARTIAL_OUTPUT_HOLD_S + 1) == [event.id]
    assert store.partial_output_written(job_id) == [event.id]       # written: due now
    assert store.outbox.due() == [event.id]
    assert store.outbox.claim(event.id).attempts == 1
    assert store.partial_output_written(job_id) == []               # once


def test_due_webhooks_oldest_first_and_limited(store):
    event_ids = []
    for _ in range(3):
        job_id = new_job(store)
        event = outbox_event(job_id)
        store.finish_job(job_id, JobStatus.FAILED, event=event)
        event_ids.append(event.id)
    assert store.outbox.due() == event_ids
    assert store.outbox.due(limit=2) == event_ids[:2]


# --- concurrency ----------------------------------------------------------------------


NUM_THREADS = 8


def test_concurrent_commits_see_the_job_ready_exactly_once(store):
    job_id = running_job(store, num_shards=NUM_THREADS)
    claims = [store.claim_shard(job_id, i) for i in range(NUM_THREADS)]
    barrier = threading.Barrier(NUM_THREADS)
    results: list[tuple[bool, bool] | BaseException] = [None] * NUM_THREADS

    def commit_one(shard_index: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[shard_index] = commit(store, job_id, shard_index, claims[shard_index].token)
        except BaseException as error:  # noqa: BLE001 - reported by the assertion below
            results[shard_index] = error

    threads = [threading.Thread(target=commit_one, args=(i,)) for i in range(NUM_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert all(isinstance(result, tuple) for result in results), results
    assert all(is_committed for is_committed, _ in results)
    assert sum(is_ready for _, is_ready in results) == 1
    assert shard_statuses(store, job_id) == [ShardStatus.COMMITTED] * NUM_THREADS
    assert store.begin_finalize(job_id)
