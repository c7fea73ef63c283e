"""Worker metrics (queueing.metrics) as Prometheus exposition text: names, labels, the
SQL-backed shard counts read per scrape, and the engine's step records."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from engine.step_stats import StepStats
from queueing.metrics import WorkerMetrics
from queueing.usage import ShardUsage


def samples(metrics: WorkerMetrics) -> dict[tuple[str, tuple], float]:
    text = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_committed_shard_moves_rows_tokens_errors_and_the_latency_histogram():
    metrics = WorkerMetrics()
    usage = ShardUsage(model="minilm", mode="embed", num_rows=40, rows_failed=2, num_tokens=600,
                       error_kinds={"null_input": 2})
    with metrics.shard_attempt() as finished:
        assert samples(metrics)[("barge_worker_shards_in_progress", ())] == 1
        finished("committed", usage)
    with metrics.shard_attempt() as finished:
        finished("dropped", None)
    got = samples(metrics)
    labels = (("mode", "embed"), ("model", "minilm"))
    assert got[("barge_rows_processed_total", labels)] == 40
    assert got[("barge_tokens_processed_total", labels)] == 600
    assert got[("barge_row_errors_total", (("kind", "null_input"),))] == 2
    assert got[("barge_shard_attempts_total", (("outcome", "committed"),))] == 1
    assert got[("barge_shard_attempts_total", (("outcome", "dropped"),))] == 1
    assert got[("barge_shard_duration_seconds_count", (("model", "minilm"),))] == 1
    assert got[("barge_worker_shards_in_progress", ())] == 0


def test_pending_and_running_shards_per_model_come_from_the_callback_at_each_scrape():
    counts = {("minilm", "pending"): 5, ("minilm", "running"): 1}
    metrics = WorkerMetrics(lambda: dict(counts))
    assert samples(metrics)[("barge_shards_pending", (("model", "minilm"),))] == 5
    counts[("minilm", "pending")] = 3
    got = samples(metrics)
    assert got[("barge_shards_pending", (("model", "minilm"),))] == 3
    assert got[("barge_shards_running", (("model", "minilm"),))] == 1


def test_a_failing_count_query_leaves_the_other_metrics_scrapable():
    def broken():
        raise ConnectionError("database down")
    metrics = WorkerMetrics(broken)
    metrics.webhook_delivery("delivered")
    got = samples(metrics)
    assert got[("barge_webhook_deliveries_total", (("outcome", "delivered"),))] == 1
    assert not any(name == "barge_shards_pending" for name, _ in got)


class ObservedEngine:
    """Holds the step observer the metrics attach, as Engine.add_step_observer does."""

    def __init__(self):
        self.observers = []

    def add_step_observer(self, observer) -> None:
        self.observers.append(observer)


def test_generate_steps_move_the_batch_kv_cache_and_preemption_metrics():
    metrics, engine = WorkerMetrics(), ObservedEngine()
    metrics.observe_engine(engine, "smollm2", "generate")
    labels = (("mode", "generate"), ("model", "smollm2"))
    before = samples(metrics)
    assert before[("barge_engine_steps_total", labels)] == 0 and before[("barge_preemptions_total", labels)] == 0
    assert ("barge_batch_max_sequences", labels) not in before, "no limit is claimed before the engine ran"
    [observe] = engine.observers
    # When: a prefill step bound by tokens, then a decode step bound by sequences that preempted two.
    observe(StepStats(4, 2048, 128, 2048, 300, 1000, num_prefix_cache_hit_tokens=64))
    observe(StepStats(128, 128, 128, 2048, 900, 1000, num_preemptions=2))
    got = samples(metrics)
    assert got[("barge_engine_steps_total", labels)] == 2
    assert (got[("barge_batch_sequences_count", labels)], got[("barge_batch_sequences_sum", labels)]) == (2, 132)
    assert got[("barge_batch_tokens_sum", labels)] == 2176
    assert got[("barge_batch_tokens_bucket", (("le", "128.0"), *labels))] == 1
    assert got[("barge_batch_occupancy_ratio_bucket", (("le", "0.99"), *labels))] == 0, "both steps were full"
    assert got[("barge_batch_occupancy_ratio_bucket", (("le", "1.0"), *labels))] == 2
    assert (got[("barge_batch_max_sequences", labels)], got[("barge_batch_max_tokens", labels)]) == (128, 2048)
    assert got[("barge_kv_cache_blocks_used", labels)] == 900, "the last step's"
    assert got[("barge_kv_cache_blocks_capacity", labels)] == 1000
    assert got[("barge_kv_cache_usage_ratio", labels)] == 0.9
    assert got[("barge_preemptions_total", labels)] == 2
    assert got[("barge_prefix_cache_hit_tokens_total", labels)] == 64


def test_an_embed_engine_reports_its_token_budget_and_no_kv_cache():
    metrics, engine = WorkerMetrics(), ObservedEngine()
    metrics.observe_engine(engine, "minilm", "embed")
    engine.observers[0](StepStats(30, 1500, None, 2048))
    got = samples(metrics)
    labels = (("mode", "embed"), ("model", "minilm"))
    assert got[("barge_batch_max_tokens", labels)] == 2048 and got[("barge_batch_tokens_sum", labels)] == 1500
    assert not any(name.startswith("barge_kv_cache") or name == "barge_batch_max_sequences" for name, _ in got)
