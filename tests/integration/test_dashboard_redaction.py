"""The dashboard shows the job of tests/integration/test_url_redaction.py (a Slack
webhook whose path is its token, metadata with an api_key, an AWS secret and another
receiver's URL) through the real app on a real SQLite store, to the API key that owns
it: the hosts and the plain metadata, none of the secrets, in the HTML and the JSON."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from api.app import create_app
from jobs.api_batches import ApiBatches, BatchRecord, new_batch_id
from jobs.api_keys import ApiKeys
from jobs.client import Client
from jobs.settings import Settings
from tests.integration.test_url_redaction import HIDDEN_VALUES, slack_job


def test_the_job_page_and_its_json_show_hosts_but_no_secret(sqlite_store, tmp_path):
    store = sqlite_store
    job_id, _ = slack_job(store, output=f"{tmp_path}/out/")   # local: the page looks for its errors file
    viewer = ApiKeys(store.engine).create("viewer")
    ApiBatches(store.engine).create(BatchRecord(id=new_batch_id(), key_id=viewer.key.id, job_id=job_id,
                                                endpoint="/v1/embeddings", model="minilm", input_file_id="file-x",
                                                completion_window="24h", created_at=time.time()))
    client = Client(settings=Settings.from_env({"BARGE_DATA_DIR": str(tmp_path / "data"),
                                                "BARGE_DATABASE_URL": store.url}))
    http = TestClient(create_app(client), client=("127.0.0.1", 50000), base_url="http://localhost",
                      headers={"Authorization": f"Bearer {viewer.secret}"}, follow_redirects=False)
    answers = {path: http.get(path) for path in ("/dashboard/jobs", f"/dashboard/jobs/{job_id}",
                                                 f"/dashboard/jobs/{job_id}?fragment=1", "/dashboard/api/jobs",
                                                 f"/dashboard/api/jobs/{job_id}")}
    for path, answer in answers.items():
        assert answer.status_code == 200, (path, answer.text[:300])
        for secret in HIDDEN_VALUES + ("presigned-sig-1", "whsec_"):
            assert secret not in answer.text, (path, secret)
    found = answers[f"/dashboard/api/jobs/{job_id}"].json()
    assert found["spec"]["webhook_url"] == "https://hooks.slack.com/***"
    assert found["spec"]["input"] == "s3://corpus/in/a.parquet?***"
    assert found["spec"]["metadata"] == {"team": "search", "api_key": "***", "aws_secret_access_key": "***",
                                         "notify": "https://notify.example.com/***"}
    assert [event["url"] for event in found["webhooks"]] == ["https://hooks.slack.com/***"]
    assert found["webhooks"][0]["attempts"][0]["error"] == "HTTP 410 Gone from https://hooks.slack.com/***"
    page = answers[f"/dashboard/jobs/{job_id}?fragment=1"].text
    assert "to https://hooks.slack.com/***" in page and "notify.example.com/***" in page
