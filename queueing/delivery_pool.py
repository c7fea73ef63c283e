"""Concurrent webhook delivery: a few threads, and at most `per_host` attempts in flight
to any one host, so a receiver that hangs holds only its own events.

NOTE: concurrency does not weaken the outbox's guarantee. Every attempt still claims
its event in SQL under a lease before it sends (jobs.outbox.Outbox.claim), so two
threads, or the dispatchers of two workers, that pick the same due event send it once.
The limits are per dispatcher, that is per worker process: N workers may have
N × per_host attempts open to one host. The threads are daemons: a worker that exits
mid-attempt abandons it, and its claim's lease runs out as if the worker had died.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

log = logging.getLogger("barge.webhooks")

DueDelivery = tuple[str, str]   # (event id, url)


@dataclass(frozen=True)
class DeliveryLimits:
    """How many delivery attempts one dispatcher keeps open."""

    num_threads: int = 8   # attempts in flight at once
    per_host: int = 2      # of which to one host (host and port, as the Host header names it)

    def __post_init__(self) -> None:
        for name in ("num_threads", "per_host"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> DeliveryLimits:
        values = {}
        for name, variable in (("num_threads", "BARGE_WEBHOOK_THREADS"), ("per_host", "BARGE_WEBHOOK_PER_HOST")):
            if environ.get(variable):
                try:
                    values[name] = int(environ[variable])
                except ValueError:
                    raise ValueError(f"{variable}: {environ[variable]!r} is not an integer") from None
        return cls(**values)


def host_of(url: str) -> str:
    """The host a delivery goes to, with its port: "example.com:443"."""
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower(), 0)
    return f"{(parts.hostname or '').lower()}:{port}"


def pick_deliveries(due: list[DueDelivery], in_flight: Mapping[str, str], limits: DeliveryLimits) -> list[DueDelivery]:
    """The due events to start now, in order: none already in flight, no host past its
    limit, no more than the free threads. `in_flight` maps event id -> host."""
    num_free = limits.num_threads - len(in_flight)
    per_host = Counter(in_flight.values())
    picked = []
    for event_id, url in due:
        if len(picked) >= num_free:
            break
        host = host_of(url)
        if event_id in in_flight or per_host[host] >= limits.per_host:
            continue
        per_host[host] += 1
        picked.append((event_id, url))
    return picked


class DeliveryPool:
    """Runs `deliver(event_id)` on its threads within `limits`; `start_due` never blocks."""

    def __init__(self, deliver: Callable[[str], object], limits: DeliveryLimits):
        self.deliver = deliver
        self.limits = limits
        self.in_flight: dict[str, str] = {}   # event id -> host, while its attempt runs
        self._lock = threading.Lock()
        self._started: queue.SimpleQueue[str | None] = queue.SimpleQueue()   # event ids; None: stop
        self._threads = [threading.Thread(target=self._work, name=f"barge-webhook-{i}", daemon=True)
                         for i in range(limits.num_threads)]
        for thread in self._threads:
            thread.start()

    def start_due(self, due: list[DueDelivery]) -> list[str]:
        """Start what `pick_deliveries` allows of `due`; the ids started. The rest stay
        due in the outbox for the next pass."""
        with self._lock:
            picked = pick_deliveries(due, self.in_flight, self.limits)
            for event_id, url in picked:
                self.in_flight[event_id] = host_of(url)
        for event_id, _url in picked:
            self._started.put(event_id)
        return [event_id for event_id, _url in picked]

    def close(self, wait: bool = False) -> None:
        """Stop the threads once the attempts started have ended (`wait`: until then)."""
        for _thread in self._threads:
            self._started.put(None)
        if wait:
            for thread in self._threads:
                thread.join()

    def _work(self) -> None:
        while (event_id := self._started.get()) is not None:
            try:
                self.deliver(event_id)
            except Exception:   # a database blip: the claim's lease runs out and the event is due again
                log.exception("webhook %s: delivery attempt failed", event_id)
            finally:
                with self._lock:
                    del self.in_flight[event_id]
