"""Webhook delivery from the outbox: claim → send → record.

A job's final event is written in the same transaction as its final state. The task
that finishes the job tries the first delivery at once; every worker also runs a
`Dispatcher` thread that delivers whatever is due, so a failed attempt, a crashed
worker or a broker outage delays an event but never loses it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time

from queueing.runtime import Runtime
from webhooks.deliver import retry_delay, send
from webhooks.events import WebhookEvent
from webhooks.safety import allow_hosts_from_env

log = logging.getLogger("barge.webhooks")

MAX_ATTEMPTS = int(os.environ.get("BARGE_WEBHOOK_MAX_ATTEMPTS", "25"))
RETRY_BASE_S = float(os.environ.get("BARGE_WEBHOOK_RETRY_BASE_S", "5"))


def deliver(runtime: Runtime, event_id: str) -> bool | None:
    """One delivery attempt; True delivered, False not (yet), None not claimable."""
    store = runtime.store
    record = store.claim_webhook(event_id)
    if record is None:
        return None
    secret = store.webhook_secret(record.job_id)
    payload = json.loads(record.body)
    event = WebhookEvent(event_id=record.id, type=record.type, job_id=record.job_id,
                         created_at=payload["timestamp"], data=payload["data"])
    result = send(record.url, event, secret, allow_hosts=allow_hosts_from_env())
    attempt = record.attempts + 1
    next_attempt_at = None
    if not result.ok and not result.is_permanent and attempt < MAX_ATTEMPTS:
        next_attempt_at = time.time() + retry_delay(attempt, base_s=RETRY_BASE_S,
                                                    retry_after_s=result.retry_after_s)
    store.record_delivery(event_id, ok=result.ok, status_code=result.status_code, error=result.error,
                          next_attempt_at=next_attempt_at)
    if result.ok:
        log.info("webhook %s (%s, job %s) delivered: HTTP %s", event_id, record.type, record.job_id,
                 result.status_code)
    else:
        log.warning("webhook %s attempt %d failed: %s%s", event_id, attempt, result.error,
                    "" if next_attempt_at else "; giving up")
    return result.ok


class Dispatcher(threading.Thread):
    """Delivers due outbox events every `interval_s` until stopped."""

    def __init__(self, runtime: Runtime, interval_s: float = 2.0):
        super().__init__(name="barge-webhook-dispatcher", daemon=True)
        self.runtime = runtime
        self.interval_s = interval_s
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            try:
                for event_id in self.runtime.store.due_webhooks():
                    deliver(self.runtime, event_id)
            except Exception:   # a database blip must not kill the thread
                log.exception("webhook dispatcher pass failed")

    def stop(self) -> None:
        self.stopped.set()
