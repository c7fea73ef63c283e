"""A batch whose job fails says why, through the real app (POST /v1/files, POST
/v1/batches, GET /v1/batches/{id}, GET /v1/files/{id}/content) over a real store, SQLite
file and PostgreSQL: the batch's `errors` carry the job's error (code `batch_failed`,
redacted), and each line of its error file carries the reason cut short, not only "the
batch failed". The worker that failed the job may be on another host; its log is not the
caller's to read.

Given a batch whose input the worker cannot read (its folder is missing on the worker's
host), when the real planner runs, then the batch reads `failed` with the planner's reason.
Given a job failed with a reason naming a URL with credentials and a long message, then
the batch's errors hold it redacted and whole, and each line holds it redacted and cut."""

from __future__ import annotations

import json
import os

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.batch_output import MAX_LINE_REASON_CHARS
from api.batch_store import batch_folder
from jobs.api_keys import ApiKeys
from jobs.client import Client
from jobs.settings import Settings
from jobs.status import JobStatus
from queueing import planning
from queueing.app import create_app as create_queue_app
from queueing.runtime import Runtime
from storage.redaction import redact_text
from tests.integration.test_store import postgres_url, store, store_url  # noqa: F401 (fixtures)

LINES = [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/embeddings",
          "body": {"model": "minilm", "input": f"sentence {i}"}} for i in range(3)]


@pytest.fixture
def deployment(store, tmp_path, monkeypatch):
    """The app with a key, serving an embed model known by its config.json alone (no job
    here runs it), and the store's job client."""
    (tmp_path / "minilm").mkdir()
    (tmp_path / "minilm" / "config.json").write_text(json.dumps({"architectures": ["BertModel"], "hidden_size": 384}))
    monkeypatch.setenv("BARGE_MODELS", f"minilm={tmp_path / 'minilm'}")
    monkeypatch.delenv("BARGE_API_FILES_URL", raising=False)
    client = Client(settings=Settings.from_env({"BARGE_DATA_DIR": str(tmp_path / "data"),
                                                "BARGE_DATABASE_URL": store.url}))
    secret = ApiKeys(store.engine).create("failures").secret
    with TestClient(create_app(client), base_url="http://localhost",
                    headers={"Authorization": f"Bearer {secret}"}) as http:
        yield http, client


def create_batch(http: TestClient) -> dict:
    data = "".join(json.dumps(line) + "\n" for line in LINES).encode()
    uploaded = http.post("/v1/files", files={"file": ("lines.jsonl", data)}, data={"purpose": "batch"})
    assert uploaded.status_code == 200, uploaded.text[:500]
    created = http.post("/v1/batches", json={"input_file_id": uploaded.json()["id"], "endpoint": "/v1/embeddings",
                                             "completion_window": "24h"})
    assert created.status_code == 200, created.text[:500]
    return created.json()


def job_of(client: Client, batch: dict) -> str:
    (job,) = client.jobs()
    assert client.store.get_job(job.job_id).spec.metadata["openai_batch_id"] == batch["id"]
    return job.job_id


def settled(http: TestClient, batch_id: str) -> tuple[dict, list[dict]]:
    """The batch as read (twice: settled once, the same for every reader) and its error file's lines."""
    batch = http.get(f"/v1/batches/{batch_id}").json()
    assert http.get(f"/v1/batches/{batch_id}").json()["errors"] == batch["errors"]
    content = http.get(f"/v1/files/{batch['error_file_id']}/content")
    assert content.status_code == 200, content.text[:500]
    return batch, [json.loads(line) for line in content.text.splitlines()]


def test_a_batch_whose_input_the_worker_cannot_read_fails_with_the_planners_reason(deployment):
    http, client = deployment
    batch = create_batch(http)
    job_id = job_of(client, batch)
    runtime = Runtime(settings=client.settings, store=client.store, app=create_queue_app(client.settings))
    # The worker's host has no such folder (nothing is shared with the API's host): hidden
    # while the real planner runs, and back for the API to settle the batch from.
    folder = batch_folder(str(client.settings.data_dir / "api"), batch["id"])
    os.rename(folder, folder + ".elsewhere")
    try:
        assert planning.plan_job(runtime, job_id) == 0
    finally:
        os.rename(folder + ".elsewhere", folder)
    job = client.store.get_job(job_id)
    assert job.status == JobStatus.FAILED and job.error.startswith("planning failed: ")

    batch, lines = settled(http, batch["id"])
    assert batch["status"] == "failed" and batch["failed_at"] is not None
    assert batch["errors"] == {"object": "list", "data": [{"code": "batch_failed", "message": job.error,
                                                           "param": None, "line": None}]}
    assert batch["request_counts"] == {"total": 3, "completed": 0, "failed": 3} and batch["output_file_id"] is None
    assert [line["custom_id"] for line in lines] == ["line-0", "line-1", "line-2"]
    for line in lines:
        assert line["response"] is None and line["error"]["code"] == "batch_failed"
        assert line["error"]["message"] == f"This request was not executed: the batch failed: {job.error}"
        assert "requests.parquet" in line["error"]["message"]   # which file the worker could not read


def test_the_reason_is_redacted_whole_on_the_batch_and_cut_on_each_line(deployment):
    http, client = deployment
    batch = create_batch(http)
    job_id = job_of(client, batch)
    reason = ("committing the output failed: PermissionError: https://barge:hunter2@minio.internal:9000/results "
              "refused the write; " + "retry later. " * 60)
    assert client.store.finish_job(job_id, JobStatus.FAILED, error=reason)   # as queueing.finalize records it

    batch, lines = settled(http, batch["id"])
    (error,) = batch["errors"]["data"]
    assert batch["status"] == "failed" and error["code"] == "batch_failed"
    assert error["message"] == redact_text(reason)   # whole
    assert "hunter2" not in error["message"] and "https://***@minio.internal:9000" in error["message"]
    for line in lines:
        message = line["error"]["message"]
        assert message.startswith("This request was not executed: the batch failed: committing the output failed: "
                                  "PermissionError: https://***@minio.internal:9000")
        assert "hunter2" not in message and message.endswith("…")
        assert len(message) == len("This request was not executed: the batch failed: ") + MAX_LINE_REASON_CHARS
