"""Webhook delivery from the outbox to a real HTTP server on 127.0.0.1 (allow-listed).

Given an event in the outbox of a real SQLite store, when dispatchers claim → send →
record it against a receiver that misbehaves in some way, then every attempt is
recorded and the event is retried, held or given up exactly as issue 7 says.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cli.main import main as barge
from jobs.events import final_event
from jobs.spec import JobSpec
from jobs.status import JobStatus
from jobs.store import Store
from queueing.dispatch import deliver_event, expire_jobs
from tests.support.receiver import Answer, WebhookReceiver
from webhooks.retry import RetryPolicy
from webhooks.signing import generate_secret, verify

LOCAL = ("127.0.0.1",)
REPO = Path(__file__).resolve().parents[2]
FAST = RetryPolicy(base_s=0.05, cap_s=0.2, max_attempts=5, connect_timeout_s=1.0, read_timeout_s=0.5,
                   lease_margin_s=0.5)


@pytest.fixture
def store(sqlite_store):
    return sqlite_store


def queue_event(store: Store, url: str, *, status: JobStatus = JobStatus.FAILED, **spec_changes) -> tuple[str, str]:
    """A finished job whose final event is in the outbox: (event id, webhook secret)."""
    secret = generate_secret()
    spec = JobSpec(mode="embed", model="minilm", input="/in/a.parquet", output="/out/", webhook_url=url,
                   **spec_changes)
    job_id = store.create_job(spec, model_key="all-MiniLM-L6-v2", rows_total=10, output_schema="s",
                              webhook_secret=secret)
    event = final_event(store, job_id, status, "boom")
    assert store.finish_job(job_id, status, error="boom", event=event)
    return event.id, secret


def deliver_until_settled(store: Store, event_id: str, policy: RetryPolicy = FAST, timeout_s: float = 15.0) -> str:
    """Act as a dispatcher: deliver whenever due, until the event leaves `pending`."""
    deadline = time.monotonic() + timeout_s
    while (status := store.outbox.event(event_id).status) == "pending":
        assert time.monotonic() < deadline, f"event {event_id} still pending"
        deliver_event(store, event_id, policy, allow_hosts=LOCAL)
        time.sleep(0.02)
    return status


def test_fails_the_first_attempts_then_delivers_the_same_signed_event(store):
    with WebhookReceiver(responses=[500, 502, 503]) as receiver:
        event_id, secret = queue_event(store, receiver.url)
        assert deliver_until_settled(store, event_id) == "delivered"
        requests = receiver.wait_for(4)
    assert len(requests) == 4
    assert {headers["webhook-id"] for headers, _ in requests} == {event_id}
    assert len({body for _, body in requests}) == 1, "every attempt sends the same bytes"
    assert verify(secret, *requests[-1])["type"] == "job.failed"
    attempts = store.outbox.attempts(event_id)
    assert [(a.attempt, a.status_code) for a in attempts] == [(1, 500), (2, 502), (3, 503), (4, 200)]
    assert all(a.latency_s > 0 and a.finished_at >= a.started_at for a in attempts)
    assert attempts[0].error == "HTTP 500 Internal Server Error" and attempts[-1].error is None


def test_gives_up_after_max_attempts(store):
    with WebhookReceiver(default_status=500) as receiver:
        event_id, _ = queue_event(store, receiver.url)
        assert deliver_until_settled(store, event_id, RetryPolicy(**{**FAST.__dict__, "max_attempts": 3})) == "failed"
    assert len(receiver.requests) == 3 and len(store.outbox.attempts(event_id)) == 3


def test_a_receiver_slower_than_the_read_timeout_is_a_timeout_and_retried(store):
    with WebhookReceiver(responses=[Answer(200, delay_s=1.5)]) as receiver:
        event_id, _ = queue_event(store, receiver.url)
        assert deliver_event(store, event_id, FAST, allow_hosts=LOCAL) is False
        first = store.outbox.attempts(event_id)[0]
        assert first.status_code is None and first.error.startswith("timeout: read timed out")
        assert FAST.read_timeout_s <= first.latency_s < 1.5
        assert store.outbox.event(event_id).status == "pending"
        assert deliver_until_settled(store, event_id) == "delivered"
    assert [a.status_code for a in store.outbox.attempts(event_id)] == [None, 200]


def test_410_stops_and_disables_the_endpoint_until_re_enabled(store, monkeypatch, tmp_path, capsys):
    with WebhookReceiver(responses=[410]) as receiver:
        event_id, _ = queue_event(store, receiver.url)
        assert deliver_until_settled(store, event_id) == "failed"
        later_id, _ = queue_event(store, receiver.url, status=JobStatus.CANCELLED)
        assert deliver_event(store, later_id, FAST, allow_hosts=LOCAL) is None
        assert len(receiver.requests) == 1, "nothing more is sent to a disabled endpoint"
        assert store.outbox.event(later_id).status == "disabled" and store.outbox.attempts(later_id) == []
        [endpoint] = store.outbox.endpoints()
        assert endpoint.url == receiver.url and endpoint.disabled_at is not None

        use_store_from_cli(monkeypatch, store)
        assert barge(["webhooks", "endpoints"]) == 0
        assert "disabled" in capsys.readouterr().out
        assert barge(["webhooks", "replay", later_id]) == 1
        assert "barge webhooks enable" in capsys.readouterr().out
        assert barge(["webhooks", "enable", receiver.url]) == 0
        assert "1 held event(s)" in capsys.readouterr().out
        assert deliver_until_settled(store, later_id) == "delivered"
        assert receiver.wait_for(2)[1][0]["webhook-id"] == later_id


@pytest.mark.parametrize("status_code", [429, 503])
def test_retry_after_is_honoured(store, status_code):
    with WebhookReceiver(responses=[(status_code, {"Retry-After": "120"})]) as receiver:
        event_id, _ = queue_event(store, receiver.url)
        policy = RetryPolicy(**{**FAST.__dict__, "cap_s": 3600.0})
        before = time.time()
        assert deliver_event(store, event_id, policy, allow_hosts=LOCAL) is False
    event = store.outbox.event(event_id)
    assert (event.status, event.last_status_code) == ("pending", status_code)
    assert before + 119 <= event.next_attempt_at <= time.time() + 121
    assert store.outbox.due() == [] and store.outbox.due(now=before + 121) == [event_id]


def test_retry_after_on_other_statuses_is_ignored(store):
    with WebhookReceiver(responses=[(500, {"Retry-After": "120"})]) as receiver:
        event_id, _ = queue_event(store, receiver.url)
        deliver_event(store, event_id, FAST, allow_hosts=LOCAL)
    assert store.outbox.event(event_id).next_attempt_at <= time.time() + FAST.cap_s


def test_a_redirect_to_a_private_address_is_never_followed(store):
    with WebhookReceiver(host="127.0.0.2") as private, \
            WebhookReceiver(default_status=302) as receiver:
        receiver.responses = [(302, {"Location": private.url})] * 3
        event_id, _ = queue_event(store, receiver.url)
        assert deliver_until_settled(store, event_id, RetryPolicy(**{**FAST.__dict__, "max_attempts": 3})) == "failed"
        assert private.requests == [], "the redirect target was never reached"
    attempts = store.outbox.attempts(event_id)
    assert [a.status_code for a in attempts] == [302, 302, 302]
    assert all("redirect not followed" in a.error for a in attempts)


def test_a_dispatcher_killed_between_sent_and_recorded_loses_nothing(store):
    # Given a dispatcher process whose POST reached the receiver but got no answer yet,
    release = threading.Event()
    with WebhookReceiver(responses=[Answer(200, hold=release)]) as receiver:
        event_id, secret = queue_event(store, receiver.url)
        process = subprocess.Popen([sys.executable, "-m", "tests.support.deliver_once", store.url, event_id, "3",
                                    "0.1"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        try:
            receiver.wait_for(1, timeout_s=30)
            # when it is killed before it can record the attempt,
            process.send_signal(signal.SIGKILL)
            assert process.wait(timeout=10) == -signal.SIGKILL
        finally:
            if process.poll() is None:
                process.kill()
            release.set()
        [attempt] = store.outbox.attempts(event_id)
        assert attempt.finished_at is None, "sent, never recorded"
        # then, once its claim runs out, another dispatcher sends the same event again.
        assert deliver_until_settled(store, event_id) == "delivered"
        requests = receiver.wait_for(2)
    assert [headers["webhook-id"] for headers, _ in requests] == [event_id, event_id]
    assert requests[0][1] == requests[1][1]
    assert verify(secret, *requests[1])["data"]["error"] == "boom"
    assert [a.status_code for a in store.outbox.attempts(event_id)] == [None, 200]


def test_an_overdue_job_expires_with_its_event(store):
    with WebhookReceiver() as receiver:
        secret = generate_secret()
        spec = JobSpec(mode="embed", model="minilm", input="/in/a.parquet", output="/out/",
                       webhook_url=receiver.url, expires_after_s=0.01)
        job_id = store.create_job(spec, model_key="m", rows_total=10, output_schema="s", webhook_secret=secret)
        time.sleep(0.05)
        assert expire_jobs(store) == [job_id]
        assert expire_jobs(store) == []
        assert store.get_job(job_id).status == JobStatus.EXPIRED
        [event] = store.outbox.events(job_id)
        assert deliver_until_settled(store, event.id) == "delivered"
        payload = verify(secret, *receiver.wait_for(1)[0])
    assert payload["type"] == "job.expired" and payload["data"]["status"] == "expired"
    assert "expires_after_s=0.01" in payload["data"]["error"]


def test_cli_lists_shows_and_replays_without_the_secret(store, monkeypatch, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    with WebhookReceiver(responses=[500]) as receiver:
        event_id, secret = queue_event(store, receiver.url, metadata={"team": "search"})
        assert deliver_until_settled(store, event_id) == "delivered"
        job_id = store.outbox.event(event_id).job_id
        use_store_from_cli(monkeypatch, store)
        assert barge(["webhooks", "list", "--job", job_id]) == 0
        listed = capsys.readouterr().out
        assert event_id in listed and "delivered" in listed
        assert barge(["webhooks", "show", event_id]) == 0
        shown = capsys.readouterr().out
        assert "#1" in shown and "HTTP 500" in shown and "#2" in shown and '"team": "search"' in shown
        assert barge(["webhooks", "replay", event_id]) == 0
        assert "delivered again" in capsys.readouterr().out
        requests = receiver.wait_for(3)
    assert [headers["webhook-id"] for headers, _ in requests] == [event_id] * 3
    assert store.outbox.event(event_id).attempts == 3
    everything = listed + shown + caplog.text + json.dumps([a.__dict__ for a in store.outbox.attempts(event_id)])
    assert secret not in everything and secret.removeprefix("whsec_") not in everything


def use_store_from_cli(monkeypatch, store: Store) -> None:
    monkeypatch.setenv("BARGE_DATABASE_URL", store.url)
    monkeypatch.setenv("BARGE_WEBHOOK_ALLOW_HOSTS", "127.0.0.1")
