"""Prometheus metrics of one worker process, served over HTTP when a port is set
(`barge worker --metrics-port N`, or BARGE_METRICS_PORT).

Counters and the shard histogram are this process's own: sum them over workers.
`barge_shards_pending` and `barge_shards_running` are read from SQL at scrape time
and are the whole deployment's, so every worker reports the same values: take max(),
not sum(), over workers.

NOTE: they stand in for "queue depth per model queue". A broker's queue length is not
portable (the embedded transport, RabbitMQ and Redis each count differently, and the
fair-share window keeps most pending shards off the broker anyway), while SQL knows
exactly which shards wait for which model.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

if TYPE_CHECKING:
    from queueing.usage import ShardUsage

log = logging.getLogger("barge.metrics")

# Shards run for seconds (a small embedding shard) to an hour (a large generate one).
SHARD_SECONDS_BUCKETS = (0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 3600, float("inf"))


class WorkerMetrics:
    def __init__(self, shard_counts: Callable[[], dict[tuple[str, str], int]] | None = None):
        """`shard_counts`: (model key, "pending" | "running") -> shards, read from SQL per scrape."""
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.rows = Counter("barge_rows_processed", "Rows of committed shards, failed rows included.",
                            ["model", "mode"], registry=r)
        self.tokens = Counter("barge_tokens_processed", "Tokens of committed shards (embed: input tokens; "
                              "generate: prompt plus output tokens).", ["model", "mode"], registry=r)
        self.row_errors = Counter("barge_row_errors", "Rows that got an error value, by kind.", ["kind"], registry=r)
        self.shard_attempts = Counter("barge_shard_attempts", "Shard attempts this worker ended, by outcome "
                                      "(committed, dropped, lost, released, retrying, failed).", ["outcome"], registry=r)
        self.shard_seconds = Histogram("barge_shard_duration_seconds", "Wall time of committed shard attempts, "
                                       "claim to commit.", ["model"], buckets=SHARD_SECONDS_BUCKETS, registry=r)
        self.in_progress = Gauge("barge_worker_shards_in_progress", "Shards this worker is running now.", registry=r)
        self.webhooks = Counter("barge_webhook_deliveries", "Webhook delivery attempts by outcome "
                                "(delivered, retrying, failed, disabled).", ["outcome"], registry=r)
        if shard_counts is not None:
            r.register(_SqlShardCounts(shard_counts))
        self._server = None

    @contextmanager
    def shard_attempt(self) -> Iterator[Callable[[str, "ShardUsage | None"], None]]:
        """Around one run_shard task: counts it in progress, then records how it ended
        through the callback it yields (outcome status, usage of a committed shard)."""
        started = time.monotonic()
        self.in_progress.inc()

        def finished(outcome: str, usage: "ShardUsage | None") -> None:
            self.shard_attempts.labels(outcome).inc()
            if usage is not None:
                self.shard_committed(usage, time.monotonic() - started)
        try:
            yield finished
        finally:
            self.in_progress.dec()

    def shard_committed(self, usage: "ShardUsage", seconds: float) -> None:
        self.rows.labels(usage.model, usage.mode).inc(usage.num_rows)
        self.tokens.labels(usage.model, usage.mode).inc(usage.num_tokens)
        for kind, count in usage.error_kinds.items():
            self.row_errors.labels(kind).inc(count)
        self.shard_seconds.labels(usage.model).observe(seconds)

    def webhook_delivery(self, outcome: str) -> None:
        self.webhooks.labels(outcome).inc()

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve /metrics on `port` from a daemon thread."""
        self._server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        log.info("metrics on http://%s:%d/metrics", addr, port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None


class _SqlShardCounts:
    """barge_shards_pending / barge_shards_running {model}, read from SQL per scrape."""

    def __init__(self, shard_counts: Callable[[], dict[tuple[str, str], int]]):
        self.shard_counts = shard_counts
        self._lock = threading.Lock()

    def describe(self):
        return []   # nothing at registration: the query runs only when scraped

    def collect(self):
        pending = GaugeMetricFamily("barge_shards_pending", "Shards of running jobs waiting for a worker, per "
                                    "model (from SQL; the same on every worker).", labels=["model"])
        running = GaugeMetricFamily("barge_shards_running", "Shards of running jobs held by a worker, per model "
                                    "(from SQL; the same on every worker).", labels=["model"])
        try:
            with self._lock:
                counts = self.shard_counts()
        except Exception:   # a database blip must not break the scrape of the other metrics
            log.warning("reading shard counts for metrics failed", exc_info=True)
            return
        for (model, state), count in sorted(counts.items()):
            (pending if state == "pending" else running).add_metric([model], count)
        yield pending
        yield running
