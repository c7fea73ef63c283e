"""The webhook outbox: events, their delivery attempts and the endpoints that said 410.

NOTE: an attempt is claimed before its request goes out and recorded after the answer.
The claim bumps the event's attempt count and writes the attempt's row in one
transaction, under a lease; a dispatcher that dies between sending and recording
leaves an unfinished attempt row and a lease that runs out, and then the event is due
again: delivered at least once, with the same webhook-id, never dropped. A record
only moves the event if no later attempt claimed it since (attempts == attempt).

Only settled events are ever pruned: delivered, or failed with no attempt left. An
event that is pending (due, held, backing off or in flight) or disabled (waiting for
its endpoint to be re-enabled) stays whatever its age; a replay makes an event pending
again, and the prune re-checks the status under the row lock before it deletes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, and_, delete, func, insert, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite

from jobs import tables
from jobs.records import WebhookAttempt, WebhookEndpoint, WebhookRecord

PENDING, DELIVERED, FAILED, DISABLED = "pending", "delivered", "failed", "disabled"
EVENT_STATUSES = (PENDING, DELIVERED, FAILED, DISABLED)   # DISABLED: held, its endpoint said 410

_event = tables.webhook_events.c
_attempt = tables.webhook_attempts.c
_endpoint = tables.webhook_endpoints.c
RETENTION_ENV = "BARGE_OUTBOX_RETENTION_S"   # set: dispatchers prune settled events older than this
PRUNE_BATCH = 500   # events deleted per transaction: a large backlog never holds the lock for long


@dataclass(frozen=True)
class OutboxEvent:
    """A webhook event to write in the same transaction as a job's final state (or a shard's commit)."""

    id: str       # the event's webhook-id
    type: str     # job.succeeded, shard.completed, ...
    url: str      # where it is delivered (whole: only display is redacted)
    body: bytes   # the signed payload, as sent


@dataclass(frozen=True)
class PruneCount:
    num_events: int     # settled events deleted (or, on a dry run, that would be)
    num_attempts: int   # their delivery attempts


def insert_event(conn: Connection, job_id: str, event: OutboxEvent, now: float, *,
                 due_at: float | None = None) -> None:
    """Queue an event inside the caller's transaction, due at once or, held, at `due_at`
    (release_held brings it forward)."""
    conn.execute(insert(tables.webhook_events).values(
        id=event.id, job_id=job_id, type=event.type, url=event.url, body=event.body.decode(), status=PENDING,
        attempts=0, retry_from=0, next_attempt_at=now if due_at is None else due_at, claimed_until=0.0,
        created_at=now))


def release_held(conn: Connection, job_id: str, now: float) -> list[str]:
    """Make the job's pending events that are not yet due, due now (inside the caller's
    transaction); returns their ids. Only events never attempted: a retry's backoff stays."""
    held = and_(_event.job_id == job_id, _event.status == PENDING, _event.attempts == 0, _event.next_attempt_at > now)
    event_ids = list(conn.execute(select(_event.id).where(held)).scalars())
    if event_ids:
        conn.execute(update(tables.webhook_events).where(_event.id.in_(event_ids)).values(next_attempt_at=now))
    return event_ids


class Outbox:
    def __init__(self, engine: Engine):
        self.engine = engine

    def due(self, now: float | None = None, limit: int = 100) -> list[str]:
        now = time.time() if now is None else now
        query = (select(_event.id).where(_event.status == PENDING, _event.next_attempt_at <= now,
                                         _event.claimed_until <= now)
                 .order_by(_event.next_attempt_at).limit(limit))
        with self.engine.connect() as conn:
            return list(conn.execute(query).scalars())

    def due_deliveries(self, now: float | None = None, *, per_url: int = 2, limit: int = 500) -> list[tuple[str, str]]:
        """Due events as (id, url), soonest due first, at most `per_url` of each URL: the
        backlog of one URL whose receiver hangs cannot crowd the others out of a pass."""
        now = time.time() if now is None else now
        rank = func.row_number().over(partition_by=_event.url, order_by=(_event.next_attempt_at, _event.id))
        due = (select(_event.id, _event.url, _event.next_attempt_at, rank.label("rank"))
               .where(_event.status == PENDING, _event.next_attempt_at <= now, _event.claimed_until <= now)
               .subquery())
        query = (select(due.c.id, due.c.url).where(due.c.rank <= per_url)
                 .order_by(due.c.next_attempt_at, due.c.id).limit(limit))
        with self.engine.connect() as conn:
            return [(event_id, url) for event_id, url in conn.execute(query)]

    def claim(self, event_id: str, lease_s: float = 120.0) -> WebhookRecord | None:
        """Start one attempt on a due event; None if it is not due, delivered, failed,
        claimed, or held because its endpoint is disabled (then it is marked DISABLED)."""
        now = time.time()
        # Due, not only pending: a dispatcher working from an old due() list must not
        # re-send an event that another one just failed and scheduled for later.
        claimable = and_(_event.id == event_id, _event.status == PENDING, _event.next_attempt_at <= now,
                         _event.claimed_until <= now)
        disabled_urls = select(_endpoint.url).where(_endpoint.disabled_at.is_not(None))
        with self.engine.begin() as conn:
            conn.execute(update(tables.webhook_events).where(claimable, _event.url.in_(disabled_urls))
                         .values(status=DISABLED))
            claimed = conn.execute(update(tables.webhook_events).where(claimable)
                                   .values(claimed_until=now + lease_s, attempts=_event.attempts + 1)).rowcount
            if not claimed:
                return None
            record = _event_record(conn.execute(select(tables.webhook_events).where(_event.id == event_id)).one())
            conn.execute(insert(tables.webhook_attempts).values(event_id=event_id, attempt=record.attempts,
                                                                started_at=now))
        return record

    def record(self, event_id: str, attempt: int, *, ok: bool, status_code: int | None, error: str | None,
               latency_s: float, next_attempt_at: float | None, disable_endpoint: bool = False) -> None:
        """Finish attempt number `attempt`: delivered, due again at next_attempt_at, or
        failed for good (None); a 410 also disables the event's URL."""
        now = time.time()
        status = DELIVERED if ok else (PENDING if next_attempt_at is not None else FAILED)
        with self.engine.begin() as conn:
            conn.execute(update(tables.webhook_attempts)
                         .where(_attempt.event_id == event_id, _attempt.attempt == attempt)
                         .values(finished_at=now, status_code=status_code, latency_s=latency_s, error=error))
            conn.execute(update(tables.webhook_events).where(_event.id == event_id, _event.attempts == attempt)
                         .values(status=status, last_status_code=status_code, last_error=error, claimed_until=0.0,
                                 next_attempt_at=next_attempt_at or now, delivered_at=now if ok else None))
            if disable_endpoint:
                url = conn.execute(select(_event.url).where(_event.id == event_id)).scalar_one()
                _set_endpoint(conn, url, disabled_at=now, disabled_reason=f"HTTP {status_code} on event {event_id}")

    def replay(self, event_id: str) -> WebhookRecord:
        """Make an event due now with a fresh retry budget, whatever its status; the same
        event id is sent again, so receivers deduplicate it. ValueError while in flight."""
        now = time.time()
        with self.engine.begin() as conn:
            row = conn.execute(select(tables.webhook_events).where(_event.id == event_id)).one_or_none()
            if row is None:
                raise KeyError(f"no webhook event {event_id!r}")
            if row.claimed_until > now:
                raise ValueError(f"webhook event {event_id} is being delivered right now; try again shortly")
            conn.execute(update(tables.webhook_events).where(_event.id == event_id).values(
                status=PENDING, next_attempt_at=now, retry_from=row.attempts, delivered_at=None))
        return self.event(event_id)

    def prune(self, older_than_s: float, *, now: float | None = None, dry_run: bool = False) -> PruneCount:
        """Delete events settled more than `older_than_s` ago, with their attempts."""
        settled = _settled_before((time.time() if now is None else now) - older_than_s)
        if dry_run:
            with self.engine.connect() as conn:
                event_ids = select(_event.id).where(settled).scalar_subquery()
                return PruneCount(
                    conn.execute(select(func.count()).where(settled)).scalar_one(),
                    conn.execute(select(func.count()).where(_attempt.event_id.in_(event_ids))).scalar_one())
        num_events = num_attempts = 0
        while True:
            with self.engine.begin() as conn:
                batch = list(conn.execute(select(_event.id).where(settled).limit(PRUNE_BATCH).with_for_update())
                             .scalars())
                if not batch:
                    return PruneCount(num_events, num_attempts)
                num_attempts += conn.execute(delete(tables.webhook_attempts)
                                             .where(_attempt.event_id.in_(batch))).rowcount
                num_events += conn.execute(delete(tables.webhook_events).where(_event.id.in_(batch))).rowcount

    def event(self, event_id: str) -> WebhookRecord:
        with self.engine.connect() as conn:
            row = conn.execute(select(tables.webhook_events).where(_event.id == event_id)).one_or_none()
        if row is None:
            raise KeyError(f"no webhook event {event_id!r}")
        return _event_record(row)

    def events(self, job_id: str | None = None, *, status: str | None = None, limit: int = 1000) -> list[WebhookRecord]:
        """Events oldest first; of one job, or the newest `limit` of every job."""
        query = select(tables.webhook_events)
        if job_id is not None:
            query = query.where(_event.job_id == job_id)
        if status is not None:
            query = query.where(_event.status == status)
        query = query.order_by(_event.created_at.desc()).limit(limit)
        with self.engine.connect() as conn:
            return [_event_record(row) for row in reversed(conn.execute(query).all())]

    def attempts(self, event_id: str) -> list[WebhookAttempt]:
        query = select(tables.webhook_attempts).where(_attempt.event_id == event_id).order_by(_attempt.attempt)
        with self.engine.connect() as conn:
            return [WebhookAttempt(event_id=r.event_id, attempt=r.attempt, started_at=r.started_at,
                                   finished_at=r.finished_at, status_code=r.status_code, latency_s=r.latency_s,
                                   error=r.error) for r in conn.execute(query)]

    def endpoints(self) -> list[WebhookEndpoint]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(tables.webhook_endpoints).order_by(_endpoint.updated_at)).all()
        return [WebhookEndpoint(url=r.url, disabled_at=r.disabled_at, disabled_reason=r.disabled_reason,
                                updated_at=r.updated_at) for r in rows]

    def enable_endpoint(self, url: str) -> int:
        """Re-enable a disabled URL and make the events held for it due now; how many."""
        now = time.time()
        with self.engine.begin() as conn:
            _set_endpoint(conn, url, disabled_at=None, disabled_reason=None)
            return conn.execute(update(tables.webhook_events).where(_event.url == url, _event.status == DISABLED)
                                .values(status=PENDING, next_attempt_at=now, retry_from=_event.attempts)).rowcount


def retention_from_env(environ: Mapping[str, str] = os.environ) -> float | None:
    """BARGE_OUTBOX_RETENTION_S in seconds (a duration such as 30d too); None when unset."""
    raw = environ.get(RETENTION_ENV, "").strip()
    try:
        return parse_duration(raw) if raw else None
    except ValueError as exc:
        raise ValueError(f"{RETENTION_ENV}: {exc}") from None


def parse_duration(text: str) -> float:
    """"30d", "12h", "90m", "3600s" or "3600" as seconds; ValueError otherwise."""
    number, unit = (text[:-1], text[-1].lower()) if text[-1:].lower() in _UNIT_S else (text, "s")
    try:
        seconds = float(number) * _UNIT_S[unit]
    except ValueError:
        raise ValueError(f"{text!r} is not a duration such as 30d, 12h, 90m or 3600s") from None
    if not seconds >= 0:
        raise ValueError(f"{text!r} is not a duration of zero or more")
    return seconds


_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}


def _settled_before(cutoff: float):
    # record() leaves a failed event's next_attempt_at at the time it gave up.
    return or_(and_(_event.status == DELIVERED, _event.delivered_at < cutoff),
               and_(_event.status == FAILED, _event.next_attempt_at < cutoff))


def _set_endpoint(conn: Connection, url: str, **values) -> None:
    values["updated_at"] = time.time()
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    statement = dialect.insert(tables.webhook_endpoints).values(url=url, **values)
    conn.execute(statement.on_conflict_do_update(index_elements=["url"], set_=values))


def _event_record(row) -> WebhookRecord:
    return WebhookRecord(id=row.id, job_id=row.job_id, type=row.type, url=row.url, body=row.body.encode(),
                         status=row.status, attempts=row.attempts, next_attempt_at=row.next_attempt_at,
                         last_status_code=row.last_status_code, last_error=row.last_error,
                         retry_from=row.retry_from, created_at=row.created_at, delivered_at=row.delivered_at,
                         claimed_until=row.claimed_until)
