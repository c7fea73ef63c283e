"""Endpoints do not block each other: a worker's Dispatcher thread delivers from a real
SQLite outbox to real HTTP receivers on 127.0.0.1, several events at once, at most
`per_host` of them open to one host; and a process that exits mid-attempt does not wait
for it (the attempt's lease covers it, as if the process had died).

Given one receiver that hangs and one that answers, when the dispatcher runs, then the
answering receiver's events arrive while the hanging one holds its own; once it lets
go, each of its events has arrived exactly once (the claims' leases kept the threads
and the passes from sending one twice).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from jobs.events import final_event
from jobs.spec import JobSpec
from jobs.status import JobStatus
from jobs.store import Store
from queueing.dispatch import Dispatcher, deliver
from tests.support.receiver import Answer, WebhookReceiver
from webhooks.signing import generate_secret

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(sqlite_store, monkeypatch):
    monkeypatch.setenv("BARGE_WEBHOOK_ALLOW_HOSTS", "127.0.0.1")
    monkeypatch.setenv("BARGE_WEBHOOK_TIMEOUT_S", "30")   # the hanging receiver outlasts the test's patience
    monkeypatch.delenv("BARGE_WEBHOOK_THREADS", raising=False)
    monkeypatch.delenv("BARGE_WEBHOOK_PER_HOST", raising=False)
    return sqlite_store


def queue_final_event(store: Store, url: str) -> str:
    spec = JobSpec(mode="embed", model="minilm", input="/in/a.parquet", output="/out/", webhook_url=url)
    job_id = store.create_job(spec, model_key="all-MiniLM-L6-v2", rows_total=1, output_schema="s",
                              webhook_secret=generate_secret())
    event = final_event(store, job_id, JobStatus.FAILED, "boom")
    assert store.finish_job(job_id, JobStatus.FAILED, error="boom", event=event)
    return event.id


def start_dispatcher(store: Store) -> Dispatcher:
    runtime = SimpleNamespace(store=store, send=lambda *args: None, metrics=None)
    dispatcher = Dispatcher(runtime, interval_s=0.1)
    dispatcher.start()
    return dispatcher


def test_a_hanging_endpoint_holds_only_its_own_events(store):
    release = threading.Event()
    with WebhookReceiver(responses=[Answer(200, hold=release)] * 6) as hanging, WebhookReceiver() as answering:
        # Given six events for a receiver that hangs, due before three for one that answers,
        hanging_ids = [queue_final_event(store, hanging.url) for _ in range(6)]
        answering_ids = [queue_final_event(store, answering.url) for _ in range(3)]
        # when a dispatcher runs,
        dispatcher = start_dispatcher(store)
        try:
            # then the answering receiver gets its events while the other still hangs,
            answered = answering.wait_for(3, timeout_s=10)
            assert sorted(headers["webhook-id"] for headers, _ in answered) == sorted(answering_ids)
            assert not release.is_set()
            # and the hanging host never has more than per_host (2) attempts open.
            hanging.wait_for(2, timeout_s=5)
            time.sleep(1.0)   # ten more passes
            assert len(hanging.requests) == 2
            assert {store.outbox.event(event_id).status for event_id in answering_ids} == {"delivered"}
            # Once it answers, every one of its events arrives, each exactly once.
            release.set()
            deadline = time.monotonic() + 20
            while {store.outbox.event(event_id).status for event_id in hanging_ids} != {"delivered"}:
                assert time.monotonic() < deadline, "the hanging receiver's events were not all delivered"
                time.sleep(0.1)
        finally:
            release.set()
            dispatcher.stop()
            dispatcher.join(timeout=10)
    assert sorted(headers["webhook-id"] for headers, _ in hanging.requests) == sorted(hanging_ids)
    assert all(store.outbox.event(event_id).attempts == 1 for event_id in hanging_ids + answering_ids)


LEAVE_MID_ATTEMPT = """
import sys, time
from types import SimpleNamespace
from jobs.store import Store
from queueing.dispatch import Dispatcher, deliver
store = Store(sys.argv[1])
dispatcher = Dispatcher(SimpleNamespace(store=store, send=lambda *args: None, metrics=None))
assert dispatcher.dispatch_once()
time.sleep(1.0)   # the attempt is open, its receiver holds it
print("leaving", flush=True)
"""


def test_a_worker_exits_without_waiting_for_a_hanging_attempt(store):
    # Given a process whose dispatcher has an attempt open to a receiver that hangs,
    release = threading.Event()
    with WebhookReceiver(responses=[Answer(200, hold=release)]) as hanging:
        event_id = queue_final_event(store, hanging.url)
        started = time.monotonic()
        # when its main thread ends, then it exits at once (the attempt would take 30 s),
        leaver = subprocess.run([sys.executable, "-c", LEAVE_MID_ATTEMPT, store.url], cwd=REPO, timeout=60,
                                env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True)
        elapsed_s = time.monotonic() - started
        release.set()
    assert leaver.returncode == 0 and "leaving" in leaver.stdout, leaver.stderr[-2000:]
    assert elapsed_s < 20, f"the process waited {elapsed_s:.1f}s for the open attempt"
    assert len(hanging.requests) == 1
    # and the event is left claimed, to be sent again once the lease runs out.
    event = store.outbox.event(event_id)
    assert event.status == "pending" and event.claimed_until > time.time()


def test_a_tasks_first_attempt_does_not_wait_for_a_hanging_receiver(store):
    # Given a worker whose dispatcher has its pool, and a job's final event for a receiver that hangs,
    release = threading.Event()
    with WebhookReceiver(responses=[Answer(200, hold=release)]) as hanging:
        event_id = queue_final_event(store, hanging.url)
        runtime = SimpleNamespace(store=store, send=lambda *args: None, metrics=None)
        dispatcher = Dispatcher(runtime, interval_s=60)   # not started: no pass will come
        try:
            # when the task that finished the job makes the first attempt,
            started = time.monotonic()
            deliver(runtime, event_id)
            returned_s = time.monotonic() - started
            # then the task goes on at once, while the attempt runs on the pool.
            hanging.wait_for(1, timeout_s=10)
            release.set()
            deadline = time.monotonic() + 20
            while store.outbox.event(event_id).status != "delivered":
                assert time.monotonic() < deadline, "the pool's attempt did not finish"
                time.sleep(0.05)
        finally:
            release.set()
            dispatcher.pool.close(wait=True)
    assert returned_s < 2, f"the task waited {returned_s:.1f}s for the receiver"
