"""A whole job whose webhook receiver is down at first: a real worker process on the
embedded deployment keeps retrying, and every event (the final one and the opt-in
shard and progress events) arrives once the receiver comes up, signed and verifiable."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from jobs import JobSpec, JobStatus
from jobs.events import is_progress_step
from tests.support.receiver import WebhookReceiver
from tests.support.stack import free_port, stack, wait_until
from webhooks import verify

NUM_ROWS, ROWS_PER_SHARD = 60, 20


def test_events_arrive_after_the_receiver_comes_up(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    pq.write_table(pa.table({"doc_id": pa.array(range(NUM_ROWS), pa.int64()),
                             "text": [f"barge number {i} on the river" for i in range(NUM_ROWS)]}),
                   corpus / "part-0.parquet", row_group_size=ROWS_PER_SHARD)
    port = free_port()
    with stack("embedded", tmp_path / "barge") as deployment:
        deployment.start_worker()
        client = deployment.client()
        job = client.submit(JobSpec(mode="embed", model="minilm", input=str(corpus), id_column="doc_id",
                                    output=str(tmp_path / "out"), webhook_url=f"http://127.0.0.1:{port}/hook",
                                    max_rows_per_shard=ROWS_PER_SHARD,
                                    webhook_events=("shard.completed", "job.progress")))
        assert job.wait(timeout=120).status == JobStatus.SUCCEEDED, deployment.worker_logs()
        outbox = client.store.outbox
        final = wait_until(lambda: [e for e in outbox.events(job.id) if e.type == "job.succeeded"
                                    and e.attempts >= 2], 30, "two failed attempts of the final event")[0]
        assert all(e.status == "pending" for e in outbox.events(job.id)), "nothing arrived while it was down"
        assert "refused" in outbox.attempts(final.id)[0].error.lower()

        with WebhookReceiver(port=port) as receiver:
            wait_until(lambda: all(e.status == "delivered" for e in outbox.events(job.id)), 60,
                       f"every event delivered:\n{deployment.worker_logs()}")
            requests = list(receiver.requests)
        listed = subprocess.run([sys.executable, "-m", "cli", "webhooks", "list", "--job", job.id],
                                env={**os.environ, **deployment.env}, capture_output=True, text=True, check=True)
        worker_logs = deployment.worker_logs()

    payloads = [verify(job.webhook_secret, headers, body) for headers, body in requests]
    by_type: dict[str, list[dict]] = {}
    for payload in payloads:
        by_type.setdefault(payload["type"], []).append(payload)
    num_shards = NUM_ROWS // ROWS_PER_SHARD
    assert sorted(p["data"]["shard_index"] for p in by_type["shard.completed"]) == list(range(num_shards))
    assert len(by_type["job.progress"]) == sum(is_progress_step(n, num_shards) for n in range(num_shards + 1))
    [succeeded] = by_type["job.succeeded"]
    assert succeeded["data"]["rows"] == {"total": NUM_ROWS, "succeeded": NUM_ROWS, "failed": 0}
    assert len({headers["webhook-id"] for headers, _ in requests}) == len(outbox.events(job.id))
    assert final.id in listed.stdout and "delivered" in listed.stdout
    assert job.webhook_secret not in listed.stdout + listed.stderr
    assert "delivered" in worker_logs and job.webhook_secret.removeprefix("whsec_") not in worker_logs
