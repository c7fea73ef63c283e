"""Watching a real job (issue 11): a worker process serving Prometheus metrics over
HTTP, the job's throughput and report, and the worker's JSON log lines.

Given a worker started with --metrics-port and a job of many small shards, when the
job runs, then scrapes taken during it show the counters moving (the engine's steps
among them), and once it is done the engine's batches add up to the output's tokens, the
report's counts equal the output's and the logs carry job and shard ids but no secret."""

from __future__ import annotations

import json
import time
import urllib.request

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobs import JobSpec, JobStatus
from cli.main import main as barge
from tests.support.receiver import WebhookReceiver
from tests.support.stack import free_port, stack

NUM_ROWS, ROWS_PER_SHARD = 1200, 40
MODEL_KEY = "all-MiniLM-L6-v2"
EMBED = (("mode", "embed"), ("model", MODEL_KEY))


def write_corpus(folder) -> None:
    folder.mkdir(parents=True)
    texts = [None if i % 100 == 7 else f"barge number {i} carries {i % 13} tonnes of grain up the river"
             for i in range(NUM_ROWS)]
    pq.write_table(pa.table({"doc_id": pa.array(range(NUM_ROWS), pa.int64()), "text": pa.array(texts)}),
                   folder / "part-0.parquet", row_group_size=ROWS_PER_SHARD)


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def cli_report(deployment, job_id: str, capsys) -> dict:
    """`barge report JOB --json` as a user runs it against this deployment."""
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as env:
        for name, value in deployment.env.items():
            env.setenv(name, value)
        assert barge(["report", job_id, "--json", "--price-per-hour", "2"]) == 0
    return json.loads(capsys.readouterr().out)


def rows_processed(samples: dict) -> float:
    return samples.get(("barge_rows_processed_total", EMBED), 0.0)


def engine_steps(samples: dict) -> float:
    return samples.get(("barge_engine_steps_total", EMBED), 0.0)


@pytest.mark.parametrize("backend", ["embedded", pytest.param("postgres-rabbitmq", marks=[pytest.mark.postgres,
                                                                                          pytest.mark.rabbitmq])])
def test_metrics_move_while_a_real_job_runs_and_the_report_matches_the_output(tmp_path, backend, capsys):
    write_corpus(tmp_path / "corpus")
    port = free_port()
    with stack(backend, tmp_path / "barge", env={"BARGE_PRICE_PER_HOUR": "3.5"}) as deployment:
        deployment.start_worker(metrics_port=port)
        client = deployment.client()
        with WebhookReceiver(responses=[500]) as receiver:
            job = client.submit(JobSpec(mode="embed", model="minilm", input=str(tmp_path / "corpus"),
                                        id_column="doc_id", output=str(tmp_path / "out"),
                                        webhook_url=receiver.url, max_rows_per_shard=ROWS_PER_SHARD))
            # When: scrape while the job runs.
            seen, steps_seen, queue_gauges = [], [], []
            deadline = time.monotonic() + 180
            while not job.status().is_finished and time.monotonic() < deadline:
                samples = scrape(port)
                seen.append(rows_processed(samples))
                steps_seen.append(engine_steps(samples))
                queue_gauges.append(samples.get(("barge_shards_pending", (("model", MODEL_KEY),))))
                time.sleep(0.05)
            state = job.wait(timeout=60)
            assert state.status == JobStatus.SUCCEEDED, deployment.worker_logs()
            receiver.wait_for(2, timeout_s=30)
            time.sleep(0.5)   # the retried delivery is counted just after the receiver answers
            final = scrape(port)
        report = cli_report(deployment, job.id, capsys)
        table = job.results()
        logs = "\n".join(p.log_path.read_text() for p in deployment.workers)

    # Then: the counters moved between scrapes taken while the job was running.
    assert seen == sorted(seen), "a counter never goes down"
    during = {value for value in seen if 0 < value < NUM_ROWS}
    assert len(during) >= 2, f"too few scrapes caught the job mid-way: {seen[:10]}..."
    assert any(value is not None for value in queue_gauges), "pending shards per model, from SQL"
    assert rows_processed(final) == NUM_ROWS
    num_shards = NUM_ROWS // ROWS_PER_SHARD
    assert final[("barge_shard_duration_seconds_count", (("model", MODEL_KEY),))] == num_shards
    assert final[("barge_shard_attempts_total", (("outcome", "committed"),))] == num_shards
    assert final[("barge_row_errors_total", (("kind", "null_input"),))] == NUM_ROWS // 100
    assert final[("barge_webhook_deliveries_total", (("outcome", "retrying"),))] == 1
    assert final[("barge_webhook_deliveries_total", (("outcome", "delivered"),))] == 1

    # The engine's steps (embed: forward batches) moved during the job too.
    assert steps_seen == sorted(steps_seen)
    steps_during = {value for value in steps_seen if 0 < value < engine_steps(final)}
    assert len(steps_during) >= 2, f"too few scrapes caught the engine mid-way: {steps_seen[:10]}..."

    # The status, the report and the manifest agree with the output.
    failed = sum(error is not None for error in table.column("error").to_pylist())
    num_tokens = sum(table.column("num_tokens").to_pylist())
    assert final[("barge_tokens_processed_total", EMBED)] == num_tokens
    # Every embedded row went through exactly one batch, each within the budget the report shows.
    assert final[("barge_batch_tokens_sum", EMBED)] == num_tokens
    assert final[("barge_batch_sequences_sum", EMBED)] == table.num_rows - failed
    assert final[("barge_batch_occupancy_ratio_count", EMBED)] == engine_steps(final)
    assert final[("barge_batch_occupancy_ratio_bucket", (("le", "1.0"), *EMBED))] == engine_steps(final)
    assert (state.rows_failed, state.num_tokens) == (failed, num_tokens)
    assert state.throughput.rows_per_s > 0 and state.throughput.eta_s is None
    stats = json.loads((tmp_path / "out" / "_manifest.json").read_text())["stats"]
    assert (stats["rows_succeeded"] + stats["rows_failed"], stats["rows_failed"]) == (table.num_rows, failed)
    assert stats["num_tokens"] == num_tokens and stats["num_shards"] == num_shards
    assert set(stats["worker_seconds"]) == {"cpu"} and stats["worker_seconds"]["cpu"] > 0
    assert stats["engines"][0]["device"] == "cpu" and stats["engines"][0]["model"] == MODEL_KEY
    assert final[("barge_batch_max_tokens", EMBED)] == stats["engines"][0]["max_batch_tokens"]
    assert stats["cost"]["price_per_hour"] == 3.5 and stats["cost"]["per_million_tokens"] > 0

    assert (report["rows_succeeded"], report["rows_failed"], report["num_tokens"]) == (
        table.num_rows - failed, failed, num_tokens)
    assert report["cost"]["price_per_hour"] == 2.0

    # The worker's stderr is not a terminal: JSON lines, each shard's with its ids.
    lines = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    shard_lines = [line for line in lines if line.get("message", "").startswith("shard committed")]
    assert len(shard_lines) == num_shards
    assert all(line["job_id"] == job.id and isinstance(line["shard_id"], int) for line in shard_lines)
    assert job.webhook_secret not in logs
