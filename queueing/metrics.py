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

Engine metrics {model, mode} come from each loaded engine's step observer
(engine.step_stats): per step (generate: a scheduler step; embed: a forward batch;
transcribe: a decoder step) the steps counter, the batch-size histograms and the
preemption and prefix-cache counters move. The gauges are this worker's engine at its
last step — its limits, its KV cache (transcribe: slots) — so compare them per worker
or take avg() or max(), not sum().
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

if TYPE_CHECKING:
    from engine import Engine, StepStats
    from queueing.device_telemetry import DeviceTelemetry
    from queueing.usage import ShardUsage

log = logging.getLogger("barge.metrics")

# Shards run for seconds (a small embedding shard) to an hour (a large generate one).
SHARD_SECONDS_BUCKETS = (0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 3600, float("inf"))
# Per engine step: from one sequence or token up past a GPU's default budgets (generate:
# 128 sequences, 2048 tokens; embed on a GPU: 16384 tokens).
BATCH_SEQUENCES_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, float("inf"))
BATCH_TOKENS_BUCKETS = (1, 8, 32, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, float("inf"))
OCCUPANCY_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0, float("inf"))   # over 1: one row alone over the budget


class WorkerMetrics:
    def __init__(self, shard_counts: Callable[[], dict[tuple[str, str], int]] | None = None,
                 stalled_workers: Callable[[], int] | None = None, unserved_jobs: Callable[[], int] | None = None):
        """`shard_counts`: (model key, "pending" | "running") -> shards, read from SQL per scrape;
        `stalled_workers`: worker processes that exited because their engine stalled (SQL);
        `unserved_jobs`: queued or running jobs whose model no live worker serves (jobs.unserved)."""
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
        self.cache_unreadable = Counter("barge_cache_unreadable", "Rows of incremental jobs whose cached result "
                                        "is in a file this worker cannot read (on another host's disk, or out of "
                                        "its reach): computed again, their index entries kept.", registry=r)
        self.webhooks = Counter("barge_webhook_deliveries", "Webhook delivery attempts by outcome "
                                "(delivered, retrying, failed, disabled).", ["outcome"], registry=r)
        self._add_engine_metrics()
        if shard_counts is not None:
            r.register(_SqlShardCounts(shard_counts))
        if stalled_workers is not None:
            r.register(_SqlGauge("barge_engine_stalls", "Worker processes that exited because their engine made no "
                                 "progress within BARGE_ENGINE_STALL_S (from the workers' last heartbeats, kept until "
                                 "their rows are pruned; the same on every worker).", stalled_workers))
        if unserved_jobs is not None:
            r.register(_SqlGauge("barge_jobs_unserved", "Queued or running jobs whose model no live worker has served "
                                 "for BARGE_UNSERVED_AFTER_S (from the workers' heartbeats; the same on every worker).",
                                 unserved_jobs))
        self._engines = _EngineOoms()
        r.register(self._engines)
        self._server = None

    def _add_engine_metrics(self) -> None:
        r, labels = self.registry, ["model", "mode"]
        self.engine_steps = Counter("barge_engine_steps", "Engine steps (generate: scheduler steps; embed: "
                                    "forward batches; transcribe: decoder steps).", labels, registry=r)
        self.batch_sequences = Histogram("barge_batch_sequences", "Sequences in each engine step's batch.", labels,
                                         buckets=BATCH_SEQUENCES_BUCKETS, registry=r)
        self.batch_tokens = Histogram("barge_batch_tokens", "Tokens in each engine step's batch (embed: real, "
                                      "unpadded; transcribe: one per sequence).", labels,
                                      buckets=BATCH_TOKENS_BUCKETS, registry=r)
        self.batch_occupancy = Histogram("barge_batch_occupancy_ratio", "Share of the tighter batch limit each "
                                         "step used: max(sequences / max sequences, tokens / max tokens); 1 is full.",
                                         labels, buckets=OCCUPANCY_BUCKETS, registry=r)
        self.batch_max_sequences = Gauge("barge_batch_max_sequences", "The engine's limit on sequences per step "
                                         "(generate: max_num_seqs; transcribe: slots).", labels, registry=r)
        self.batch_max_tokens = Gauge("barge_batch_max_tokens", "The engine's limit on tokens per step "
                                      "(generate: max_num_batched_tokens; embed: max_batch_tokens).", labels, registry=r)
        self.kv_blocks_used = Gauge("barge_kv_cache_blocks_used", "KV-cache blocks held by running sequences at "
                                    "the last step (transcribe: slots, one chunk's K/V each).", labels, registry=r)
        self.kv_blocks_capacity = Gauge("barge_kv_cache_blocks_capacity", "KV-cache blocks in all (transcribe: "
                                        "slots).", labels, registry=r)
        self.kv_usage = Gauge("barge_kv_cache_usage_ratio", "KV-cache blocks used / capacity at the last step.",
                              labels, registry=r)
        self.preemptions = Counter("barge_preemptions", "Sequences evicted from the batch for KV-cache blocks, "
                                   "to be recomputed later (generate).", labels, registry=r)
        self.prefix_hits = Counter("barge_prefix_cache_hit_tokens", "Prompt tokens taken from the prefix cache "
                                   "instead of computed (generate).", labels, registry=r)
        self.prefill_tokens = Counter("barge_prefill_tokens", "Prompt tokens computed, again after a preemption "
                                      "(generate; with barge_prefix_cache_hit_tokens, every prompt token admitted).",
                                      labels, registry=r)

    def observe_engine(self, engine: "Engine", model: str, mode: str) -> None:
        """Record every step of a loaded engine under {model, mode} (model: the model key)."""
        engine.add_step_observer(_StepRecorder(self, model, mode))
        self._engines.add(engine, model, mode)

    def watch_device(self, telemetry: "DeviceTelemetry") -> None:
        """Serve the process's device figures (queueing.device_telemetry), read per scrape."""
        self.registry.register(_DeviceGauges(telemetry))

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

    def watch_bad_messages(self, count: Callable[[], int]) -> None:
        """The embedded broker's unreadable messages set aside (jobs.fs_transport),
        counted at scrape time: the deployment's, like the SQL shard counts."""
        Gauge("barge_broker_bad_messages", "Unreadable broker messages moved aside into the queue folder's "
              "bad/ (embedded broker only).", registry=self.registry).set_function(count)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve /metrics on `port` from a daemon thread."""
        self._server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        log.info("metrics on http://%s:%d/metrics", addr, port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None


class _StepRecorder:
    """One engine's step observer: its label children are bound once, so a step costs a
    few locked increments. The gauges are bound at the first step, so that a limit never
    reads 0 before the engine has run, and the KV ones only for a mode with a cache."""

    def __init__(self, metrics: WorkerMetrics, model: str, mode: str):
        self.metrics, self.labels = metrics, (model, mode)
        self.steps = metrics.engine_steps.labels(*self.labels)
        self.sequences = metrics.batch_sequences.labels(*self.labels)
        self.tokens = metrics.batch_tokens.labels(*self.labels)
        self.occupancy = metrics.batch_occupancy.labels(*self.labels)
        self.preemptions = metrics.preemptions.labels(*self.labels)
        self.prefix_hits = metrics.prefix_hits.labels(*self.labels)
        self.prefill_tokens = metrics.prefill_tokens.labels(*self.labels)
        self.gauges: dict[str, Gauge] | None = None   # field of StepStats -> its gauge's child

    def __call__(self, stats: "StepStats") -> None:
        self.steps.inc()
        self.sequences.observe(stats.num_seqs)
        self.tokens.observe(stats.num_tokens)
        self.occupancy.observe(stats.occupancy)
        if stats.num_preemptions:
            self.preemptions.inc(stats.num_preemptions)
        if stats.num_prefix_cache_hit_tokens:
            self.prefix_hits.inc(stats.num_prefix_cache_hit_tokens)
        if stats.num_prefill_tokens:
            self.prefill_tokens.inc(stats.num_prefill_tokens)
        if self.gauges is None:
            self.gauges = self._bind_gauges(stats)
        for name, gauge in self.gauges.items():
            gauge.set(getattr(stats, name))

    def _bind_gauges(self, stats: "StepStats") -> dict[str, Gauge]:
        m = self.metrics
        wanted = {"max_num_seqs": m.batch_max_sequences, "max_num_tokens": m.batch_max_tokens,
                  "num_kv_blocks_used": m.kv_blocks_used, "num_kv_blocks": m.kv_blocks_capacity,
                  "kv_cache_usage": m.kv_usage}
        return {name: gauge.labels(*self.labels) for name, gauge in wanted.items() if getattr(stats, name) is not None}


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


class _SqlGauge:
    """A fleet-wide gauge read from SQL per scrape, the same on every worker:

    barge_engine_stalls    worker processes that exited because their engine stalled
                           (queueing.stall), from their last heartbeat rows: a process that
                           stalls cannot count itself
    barge_jobs_unserved    queued or running jobs whose model no worker has served for
                           BARGE_UNSERVED_AFTER_S (jobs.unserved)
    """

    def __init__(self, name: str, documentation: str, count: Callable[[], int]):
        self.name = name
        self.documentation = documentation
        self.count = count

    def describe(self):
        return []

    def collect(self):
        try:
            count = self.count()
        except Exception:   # a database blip must not break the scrape of the other metrics
            log.warning("reading %s for metrics failed", self.name, exc_info=True)
            return
        yield GaugeMetricFamily(self.name, self.documentation, value=count)


class _EngineOoms:
    """barge_engine_oom_retries_total {model, mode}: out-of-memory errors each loaded engine
    survived by lowering its budget (engine.oom), read from the engines per scrape."""

    def __init__(self):
        self._engines: list[tuple[object, str, str]] = []

    def add(self, engine, model: str, mode: str) -> None:
        self._engines.append((engine, model, mode))

    def describe(self):
        return []

    def collect(self):
        family = CounterMetricFamily("barge_engine_oom_retries", "Out-of-memory errors in an engine step, each "
                                     "survived by lowering the engine's batch budget and running the rows again "
                                     "(the lowered budget: barge_batch_max_tokens).", labels=["model", "mode"])
        for engine, model, mode in list(self._engines):
            settings = getattr(engine, "settings", None) or {}   # a step-observed stand-in may have none
            family.add_metric([model, mode], settings.get("num_oom_retries", 0))
        yield family


# NVML figure -> (metric name, help)
_DEVICE_GAUGES = {
    "utilization": ("barge_device_utilization_ratio", "Device busy share (GPU: NVML utilization; CPU: the "
                    "machine's CPU utilization)."),
    "memory_used_bytes": ("barge_device_memory_used_bytes", "Device memory used (GPU: by every process on it; "
                          "CPU: this process's resident memory)."),
    "memory_total_bytes": ("barge_device_memory_total_bytes", "Device memory in all."),
    "power_watts": ("barge_device_power_watts", "Device power draw (GPU only)."),
    "temperature_celsius": ("barge_device_temperature_celsius", "Device temperature (GPU only)."),
}


class _DeviceGauges:
    """The engine process's device figures {device, name}; a figure the device does not
    report (a CPU's power) is left out, not 0."""

    def __init__(self, telemetry: "DeviceTelemetry"):
        self.telemetry = telemetry

    def describe(self):
        return []

    def collect(self):
        try:
            figures = self.telemetry.read()
        except Exception:   # never break the scrape of the other metrics
            log.warning("reading device figures failed", exc_info=True)
            return
        for field, (name, help_text) in _DEVICE_GAUGES.items():
            value = getattr(figures, field)
            if value is None:
                continue
            family = GaugeMetricFamily(name, help_text, labels=["device", "name"])
            family.add_metric([figures.device, figures.name], value)
            yield family
