"""Rotating a job's webhook secret: during the overlap every delivery carries a
signature under each secret, so receivers verify with either; afterwards only the new."""

from __future__ import annotations

import time

import pytest

from jobs.events import final_event
from jobs.spec import JobSpec
from jobs.status import JobStatus
from jobs.store import Store
from queueing.dispatch import deliver_event
from tests.support.receiver import WebhookReceiver
from webhooks.retry import RetryPolicy
from webhooks.signing import WebhookVerificationError, generate_secret, verify

LOCAL = ("127.0.0.1",)


@pytest.fixture
def store(sqlite_store):
    return sqlite_store


def finished_job(store: Store, url: str, secret: str) -> str:
    spec = JobSpec(mode="embed", model="minilm", input="/in/a.parquet", output="/out/", webhook_url=url)
    return store.create_job(spec, model_key="all-MiniLM-L6-v2", rows_total=1, output_schema="s",
                            webhook_secret=secret)


def deliver_final_event(store: Store, job_id: str, receiver: WebhookReceiver, num_requests: int):
    event = final_event(store, job_id, JobStatus.FAILED, "boom")
    assert store.finish_job(job_id, JobStatus.FAILED, error="boom", event=event)
    assert deliver_event(store, event.id, RetryPolicy.from_env(), allow_hosts=LOCAL)
    return receiver.wait_for(num_requests)[-1]


def test_both_secrets_verify_during_the_overlap_and_only_the_new_one_after(store):
    old, new = generate_secret(), generate_secret()
    with WebhookReceiver() as receiver:
        job_id = finished_job(store, receiver.url, old)
        store.rotate_webhook_secret(job_id, new, overlap_s=0.5)
        assert store.webhook_secrets(job_id) == [new, old]
        headers, body = deliver_final_event(store, job_id, receiver, 1)
        assert len(headers["webhook-signature"].split(" ")) == 2
        assert verify(old, headers, body)["type"] == "job.failed"
        assert verify(new, headers, body)["type"] == "job.failed"

        time.sleep(0.6)
        assert store.webhook_secrets(job_id) == [new]
        other = finished_job(store, receiver.url, old)
        store.rotate_webhook_secret(other, new, overlap_s=0.0)
        headers, body = deliver_final_event(store, other, receiver, 2)
    assert len(headers["webhook-signature"].split(" ")) == 1
    assert verify(new, headers, body)["data"]["job_id"] == other
    with pytest.raises(WebhookVerificationError, match="no matching signature"):
        verify(old, headers, body)


def test_a_job_without_a_webhook_has_no_secret_to_rotate(store):
    spec = JobSpec(mode="embed", model="minilm", input="/in/a.parquet", output="/out/")
    job_id = store.create_job(spec, model_key="m", rows_total=1, output_schema="s", webhook_secret=None)
    with pytest.raises(ValueError, match="has no webhook"):
        store.rotate_webhook_secret(job_id, generate_secret(), 60)
