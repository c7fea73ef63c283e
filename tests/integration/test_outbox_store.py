"""The outbox's housekeeping queries on real SQLite and PostgreSQL: the due events a
dispatcher starts (a few per URL), and the pruning of settled events.

Given events in every state, when the outbox is pruned, then only the events delivered
or failed longer ago than the retention go, with their attempts; an event still due,
backing off, in flight or held for a disabled endpoint stays, however old.
"""

from __future__ import annotations

import time
import uuid
from types import SimpleNamespace

import pytest

from cli.main import main as barge
from jobs.status import JobStatus
from jobs.outbox import OutboxEvent
from jobs.store import Store
from queueing.dispatch import Dispatcher
from tests.integration.test_store import new_job, postgres_url, store, store_url  # noqa: F401 (fixtures)

DAY = 86_400.0


def queue(store: Store, url: str = "http://127.0.0.1:9/hook") -> str:
    """A job that failed in planning, with its final event due now; the event's id."""
    event = OutboxEvent(id=f"msg_{uuid.uuid4().hex}", type="job.failed", url=url, body=b'{"data": {}}')
    assert store.finish_job(new_job(store, webhook_url=url), JobStatus.FAILED, error="boom", event=event)
    return event.id


def attempt(store: Store, event_id: str, *, ok: bool, retry_in_s: float | None = None) -> None:
    record = store.outbox.claim(event_id)
    store.outbox.record(event_id, record.attempts, ok=ok, status_code=200 if ok else 500,
                        error=None if ok else "HTTP 500", latency_s=0.01,
                        next_attempt_at=None if ok or retry_in_s is None else time.time() + retry_in_s)


def counts(pruned) -> tuple[int, int]:
    return pruned.num_events, pruned.num_attempts


def test_due_deliveries_start_a_few_of_each_url(store):
    hanging = [queue(store, "https://slow.example/hook") for _ in range(5)]
    answering = [queue(store, "https://fast.example/hook") for _ in range(2)]
    due = store.outbox.due_deliveries(per_url=2)
    assert [event_id for event_id, _ in due] == hanging[:2] + answering
    assert due[0][1] == "https://slow.example/hook"
    assert len(store.outbox.due_deliveries(per_url=10, limit=3)) == 3


@pytest.fixture
def events_in_every_state(store):
    delivered, failed, retrying, due, in_flight = (queue(store) for _ in range(5))
    gone, held = queue(store, "https://gone.example/hook"), queue(store, "https://gone.example/hook")
    attempt(store, delivered, ok=False, retry_in_s=0)
    attempt(store, delivered, ok=True)
    attempt(store, failed, ok=False)                       # no attempt left
    attempt(store, retrying, ok=False, retry_in_s=3600)    # backing off
    store.outbox.claim(in_flight, lease_s=10 * DAY)         # sent, no answer yet
    store.outbox.record(gone, store.outbox.claim(gone).attempts, ok=False, status_code=410, error="HTTP 410",
                        latency_s=0.01, next_attempt_at=None, disable_endpoint=True)   # failed for good
    assert store.outbox.claim(held) is None and store.outbox.event(held).status == "disabled"
    return SimpleNamespace(delivered=delivered, failed=failed, gone=gone, retrying=retrying, due=due,
                           in_flight=in_flight, held=held)


def test_prune_deletes_only_settled_events_past_the_retention(store, events_in_every_state):
    events = events_in_every_state
    assert store.outbox.prune(DAY).num_events == 0                 # all settled just now
    later = time.time() + 2 * DAY
    assert counts(store.outbox.prune(DAY, now=later, dry_run=True)) == (3, 4)
    assert len(store.outbox.events()) == 7, "a dry run deletes nothing"
    pruned = store.outbox.prune(DAY, now=later)
    assert counts(pruned) == (3, 4)
    remaining = {event.id for event in store.outbox.events()}
    assert remaining == set(vars(events).values()) - {events.delivered, events.failed, events.gone}
    assert all(store.outbox.attempts(settled) == [] for settled in (events.delivered, events.failed, events.gone))
    assert len(store.outbox.attempts(events.retrying)) == 1
    assert store.outbox.prune(0, now=later + 10 * DAY).num_events == 0, "what stays is not settled"


def test_a_replayed_event_is_not_settled_any_more(store, events_in_every_state):
    store.outbox.replay(events_in_every_state.failed)
    assert store.outbox.prune(DAY, now=time.time() + 2 * DAY).num_events == 2
    assert store.outbox.event(events_in_every_state.failed).status == "pending"


def test_cli_prunes_with_older_than(store, events_in_every_state, monkeypatch, capsys):
    monkeypatch.setenv("BARGE_DATABASE_URL", store.url)
    assert barge(["webhooks", "prune", "--older-than", "30d"]) == 0
    assert "deleted 0 event(s)" in capsys.readouterr().out
    assert barge(["webhooks", "prune", "--older-than", "0s", "--dry-run"]) == 0
    assert "would delete 3 event(s) and 4 attempt(s)" in capsys.readouterr().out
    assert barge(["webhooks", "prune", "--older-than", "0"]) == 0
    assert "deleted 3 event(s) and 4 attempt(s)" in capsys.readouterr().out
    assert len(store.outbox.events()) == 4
    with pytest.raises(SystemExit):
        barge(["webhooks", "prune", "--older-than", "a while"])


def test_a_dispatcher_prunes_when_a_retention_is_set(store, events_in_every_state, monkeypatch):
    monkeypatch.setenv("BARGE_OUTBOX_RETENTION_S", "0.2")
    time.sleep(0.3)
    run_one_pass(store)
    assert len(store.outbox.events()) == 4
    monkeypatch.delenv("BARGE_OUTBOX_RETENTION_S")
    kept = queue(store)
    attempt(store, kept, ok=True)
    time.sleep(0.3)
    run_one_pass(store)
    assert kept in {event.id for event in store.outbox.events()}, "without a retention nothing is pruned"


def run_one_pass(store: Store) -> None:
    # The due events' attempts are refused (loopback is not allow-listed): no network.
    dispatcher = Dispatcher(SimpleNamespace(store=store, send=lambda *args: None, metrics=None))
    dispatcher.dispatch_once()
    dispatcher.pool.close(wait=True)
