"""Worker metrics (queueing.metrics) as Prometheus exposition text: names, labels, and
the SQL-backed shard counts read per scrape."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

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
