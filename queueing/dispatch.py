"""Webhook delivery from the outbox: claim → send → record.

A job's final event is written in the same transaction as its final state. The task
that finishes the job tries the first delivery at once; every worker also runs a
`Dispatcher` thread that delivers whatever is due, several events at once with a limit
per host (queueing.delivery_pool), so a failed attempt, a crashed worker or a broker
outage delays an event but never loses it, and a receiver that hangs delays only its own. The dispatcher also
expires jobs past their deadline, which writes their `job.expired` event, and sends
the task that lists what each finished in a partial manifest (queueing.finalize). The
final event of a planned job that ends unfinished is held until that manifest is
written (or for jobs.store.PARTIAL_OUTPUT_HOLD_S), so its receiver finds the rows listed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Collection

from jobs.events import final_event
from jobs.outbox import retention_from_env
from jobs.secret_box import SecretKeyError
from jobs.status import InvalidTransition, JobStatus
from jobs.store import Store
from jobs.messaging import CONTROL_QUEUE, WRITE_PARTIAL_OUTPUT
from queueing.delivery_pool import DeliveryLimits, DeliveryPool
from queueing.metrics import WorkerMetrics
from queueing.runtime import Runtime
from storage.redaction import redact_text, redact_url
from webhooks.deliver import DeliveryResult, send
from webhooks.events import WebhookEvent
from webhooks.retry import RetryPolicy, next_delay
from webhooks.safety import allow_hosts_from_env

log = logging.getLogger("barge.webhooks")
PRUNE_EVERY_S = 600.0   # with a retention set, how often a dispatcher prunes (more often for a shorter one)


def deliver(runtime: Runtime, event_id: str) -> None:
    """The first attempt of an event just written (a task that finished a job): started
    on the worker's delivery pool, so the task goes on whatever the receiver does; a
    host at its limit leaves it to the dispatcher's next pass. Without a pool (a process
    that runs no Dispatcher), attempted here and now."""
    if runtime.deliveries is not None:
        runtime.deliveries.start_due([(event_id, runtime.store.outbox.event(event_id).url)])
        return
    deliver_event(runtime.store, event_id, RetryPolicy.from_env(), allow_hosts=allow_hosts_from_env(),
                  metrics=runtime.metrics)


def deliver_event(store: Store, event_id: str, policy: RetryPolicy, *,
                  allow_hosts: Collection[str] = (), metrics: WorkerMetrics | None = None) -> bool | None:
    """One delivery attempt; True delivered, False not (yet), None not claimable."""
    record = store.outbox.claim(event_id, lease_s=policy.lease_s)
    if record is None:
        return None
    payload = json.loads(record.body)
    event = WebhookEvent(event_id=record.id, type=record.type, job_id=record.job_id,
                         created_at=payload["timestamp"], data=payload["data"])
    try:
        secrets = store.webhook_secrets(record.job_id)
    except SecretKeyError as exc:   # the wrong key: never send unsigned; due again once the key is fixed
        result = DeliveryResult(ok=False, status_code=None, error=f"not sent: {exc}", latency_s=0.0,
                                retry_after_s=None, is_permanent=False)
    else:
        result = send(record.url, event, secrets, timeout_s=policy.read_timeout_s,
                      connect_timeout_s=policy.connect_timeout_s, allow_hosts=allow_hosts)
    attempt_in_series = record.attempts - record.retry_from
    delay = None if result.ok else next_delay(policy, attempt_in_series, status_code=result.status_code,
                                              retry_after_s=result.retry_after_s,
                                              is_permanent=result.is_permanent)
    store.outbox.record(event_id, record.attempts, ok=result.ok, status_code=result.status_code,
                        error=result.error, latency_s=result.latency_s,
                        next_attempt_at=None if delay is None else time.time() + delay,
                        disable_endpoint=result.status_code == 410)
    _log_attempt(record.id, record.type, record.job_id, record.url, record.attempts, result, delay)
    if metrics is not None:
        metrics.webhook_delivery(delivery_outcome(result, delay))
    return result.ok


def delivery_outcome(result: DeliveryResult, delay: float | None) -> str:
    """delivered | disabled (410 Gone) | retrying | failed (no more attempts)."""
    if result.ok:
        return "delivered"
    if result.status_code == 410:
        return "disabled"
    return "failed" if delay is None else "retrying"


def _log_attempt(event_id: str, event_type: str, job_id: str, url: str, attempt: int, result: DeliveryResult,
                 delay: float | None) -> None:
    # Never the secret, and the URL as scheme://host/*** (its path or query may be the
    # receiver's token): redacted here, not left to the handler's filter, which a process
    # that did not configure Barge's logging does not have.
    shown, error = redact_url(url), redact_text(result.error)
    if result.ok:
        log.info("webhook %s (%s, job %s) to %s delivered: HTTP %s", event_id, event_type, job_id, shown,
                 result.status_code)
    elif result.status_code == 410:
        log.warning("webhook %s: HTTP 410 Gone from %s; its endpoint is disabled until re-enabled", event_id, shown)
    else:
        log.warning("webhook %s to %s attempt %d failed: %s; %s", event_id, shown, attempt, error,
                    "giving up" if delay is None else f"next attempt in {delay:.1f}s")


def expire_jobs(store: Store) -> list[str]:
    """Move every job past its deadline to EXPIRED, each with its job.expired event."""
    expired = []
    for job_id in store.expired_jobs():
        job = store.get_job(job_id)
        error = f"not finished within expires_after_s={job.spec.expires_after_s:g}"
        try:
            is_expired = store.finish_job(job_id, JobStatus.EXPIRED, error=error,
                                          event=final_event(store, job_id, JobStatus.EXPIRED, error))
        except InvalidTransition:   # it began finalizing meanwhile: let it finish
            continue
        if is_expired:
            log.info("job %s: expired", job_id)
            expired.append(job_id)
    return expired


class Dispatcher(threading.Thread):
    """Every `interval_s` until stopped: expires overdue jobs, starts the due outbox
    events on a DeliveryPool, so one receiver that hangs holds only its own events, and
    with BARGE_OUTBOX_RETENTION_S set prunes the events settled longer ago than that."""

    def __init__(self, runtime: Runtime, interval_s: float = 2.0):
        super().__init__(name="barge-webhook-dispatcher", daemon=True)
        self.runtime = runtime
        self.interval_s = interval_s
        self.limits = DeliveryLimits.from_env()
        self.retention_s = retention_from_env()
        self.pool = DeliveryPool(self._deliver, self.limits)
        runtime.deliveries = self.pool   # the worker's tasks start first attempts here too (deliver)
        self.stopped = threading.Event()
        self._next_prune_at = 0.0   # time.monotonic()

    def run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            try:
                self.dispatch_once()
            except Exception:   # a database blip must not kill the thread
                log.exception("webhook dispatcher pass failed")
        self.pool.close()

    def dispatch_once(self) -> list[str]:
        """One pass; the ids of the events whose attempt it started."""
        store = self.runtime.store
        for job_id in expire_jobs(store):   # list what they finished (queueing.finalize)
            self.runtime.send(WRITE_PARTIAL_OUTPUT, [job_id], CONTROL_QUEUE)
        if self.retention_s is not None and time.monotonic() >= self._next_prune_at:
            self._next_prune_at = time.monotonic() + min(PRUNE_EVERY_S, self.retention_s)
            self._prune(store)
        return self.pool.start_due(store.outbox.due_deliveries(per_url=self.limits.per_host))

    def stop(self) -> None:
        self.stopped.set()

    def _prune(self, store: Store) -> None:
        pruned = store.outbox.prune(self.retention_s)
        if pruned.num_events:
            log.info("pruned %d webhook event(s) and %d attempt(s) settled over %gs ago", pruned.num_events,
                     pruned.num_attempts, self.retention_s)

    def _deliver(self, event_id: str) -> None:
        deliver_event(self.runtime.store, event_id, RetryPolicy.from_env(), allow_hosts=allow_hosts_from_env(),
                      metrics=self.runtime.metrics)
