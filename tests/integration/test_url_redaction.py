"""URLs are shown without their userinfo, query string or (on the web) path, and values
under secret names not at all, wherever Barge prints them (storage.redaction): the
webhook commands, job status and the job list on a real SQLite store, and the webhook
dispatcher's log lines, with a real receiver that still gets the whole URL."""

from __future__ import annotations

import io
import json
import logging

from cli.main import main as barge
from jobs.events import final_event
from jobs.retention import PruneReport
from jobs.spec import JobSpec
from jobs.status import JobStatus
from queueing.dispatch import deliver_event
from jobs.logs import configure_logging
from tests.support.receiver import WebhookReceiver
from webhooks.retry import RetryPolicy
from webhooks.signing import generate_secret

TOKEN = "tok-5f1c9a"


def test_webhook_commands_and_status_hide_tokens_and_passwords(sqlite_store, monkeypatch, capsys):
    store = sqlite_store
    monkeypatch.setenv("BARGE_DATABASE_URL", store.url)
    monkeypatch.setenv("BARGE_WEBHOOK_ALLOW_HOSTS", "127.0.0.1")
    with WebhookReceiver(default_status=410) as receiver:
        url = f"{receiver.url}?token={TOKEN}"   # webhook URLs carry no userinfo (JobSpec refuses it)
        spec = JobSpec(mode="embed", model="minilm", input="/in/a.parquet", webhook_url=url,
                       output=f"s3://key:{TOKEN}@bucket/out/?versionId={TOKEN}")
        job_id = store.create_job(spec, model_key="m", rows_total=1, output_schema="s",
                                  webhook_secret=generate_secret())
        error = f"could not read https://in.example/a?sig={TOKEN}"
        event = final_event(store, job_id, JobStatus.FAILED, error)
        assert store.finish_job(job_id, JobStatus.FAILED, error=error, event=event)
        assert deliver_event(store, event.id, RetryPolicy(), allow_hosts=("127.0.0.1",)) is False   # 410 Gone
        printed = []
        for command in (["webhooks", "list"], ["webhooks", "show", event.id], ["webhooks", "endpoints"],
                        ["webhooks", "replay", event.id], ["status", job_id]):
            barge(command)
            printed.append(capsys.readouterr())
    text = "".join(out.out + out.err for out in printed)
    assert f"127.0.0.1:{receiver.port}/***" in text and "s3://***@bucket/out/?***" in text
    assert TOKEN not in text


def test_schedule_prune_report_hides_them_too():
    report = PruneReport(dry_run=True, outputs=[f"s3://key:{TOKEN}@bucket/out/"],
                         cache_files=[f"https://cache.example/c.parquet?sig={TOKEN}"])
    lines = "\n".join(report.lines())
    assert "s3://***@bucket/out/" in lines and "https://cache.example/***" in lines   # a web URL: path masked too
    assert TOKEN not in lines


# A job as a user might submit it: a Slack webhook (the token is the path) and metadata
# that carries credentials and another receiver's URL.
SLACK_SECRET = "slack-path-secret-3f9a"
SLACK_URL = f"https://hooks.slack.com/services/T0SLACKWS/B0CHANNEL/{SLACK_SECRET}"
NOTIFY_SECRET = "notify-path-secret-81c2"
METADATA = {"team": "search", "api_key": "sk-meta-api-key-5d1e", "aws_secret_access_key": "aws-meta-secret-77b0",
            "notify": f"https://notify.example.com/hooks/{NOTIFY_SECRET}"}
HIDDEN_VALUES = (SLACK_SECRET, "T0SLACKWS", "B0CHANNEL", NOTIFY_SECRET, METADATA["api_key"],
                 METADATA["aws_secret_access_key"])


def slack_job(store, output: str = "s3://bucket/out/") -> tuple[str, str]:
    """A failed job with that webhook and metadata, its event's one attempt answered 410
    (so the endpoint is listed too); returns (job id, event id)."""
    spec = JobSpec(mode="embed", model="minilm", input="s3://corpus/in/a.parquet?X-Amz-Signature=presigned-sig-1",
                   output=output, webhook_url=SLACK_URL, metadata=METADATA)
    job_id = store.create_job(spec, model_key="m", rows_total=1, output_schema="s", webhook_secret=generate_secret())
    error = f"webhook {SLACK_URL} refused; notify {METADATA['notify']} too"
    event = final_event(store, job_id, JobStatus.FAILED, error)
    assert store.finish_job(job_id, JobStatus.FAILED, error=error, event=event)
    claimed = store.outbox.claim(event.id)
    store.outbox.record(event.id, claimed.attempts, ok=False, status_code=410, error=f"HTTP 410 Gone from {SLACK_URL}",
                        latency_s=0.01, next_attempt_at=None, disable_endpoint=True)
    return job_id, event.id


def test_the_cli_shows_hosts_but_no_token_path_nor_secret_metadata(sqlite_store, monkeypatch, capsys):
    store = sqlite_store
    monkeypatch.setenv("BARGE_DATABASE_URL", store.url)
    job_id, event_id = slack_job(store)
    printed = {}
    for command in (["webhooks", "list"], ["webhooks", "list", "--job", job_id], ["webhooks", "show", event_id],
                    ["webhooks", "endpoints"], ["status", job_id], ["jobs"]):
        assert barge(command) == 0
        out = capsys.readouterr()
        printed[" ".join(command[:2])] = out.out + out.err
    text = "\n".join(printed.values())
    for secret in HIDDEN_VALUES + ("presigned-sig-1", "whsec_"):
        assert secret not in text
    assert "url: https://hooks.slack.com/***" in printed["webhooks show"]
    assert '"notify": "https://notify.example.com/***"' in printed["webhooks show"]
    assert '"team": "search"' in printed["webhooks show"] and '"api_key": "***"' in printed["webhooks show"]
    assert "HTTP 410 Gone from https://hooks.slack.com/***" in printed["webhooks show"]
    assert "https://hooks.slack.com/***" in printed["webhooks endpoints"]
    assert "error: webhook https://hooks.slack.com/*** refused; notify https://notify.example.com/*** too" in \
        printed["status " + job_id]
    assert "s3://bucket/out/" in printed["status " + job_id] and "s3://bucket/out/" in printed["jobs"]


def test_webhook_logs_name_the_host_while_the_delivery_uses_the_whole_url(sqlite_store, caplog):
    """The call sites redact (caplog sees records before any handler's filter), and the
    handler Barge configures masks a whole URL that reaches it some other way."""
    store = sqlite_store
    path = f"/services/T0LOCAL/B0LOCAL/{SLACK_SECRET}"
    with WebhookReceiver([500, 410], path=path) as receiver:
        spec = JobSpec(mode="embed", model="minilm", input="/in/a.parquet", output="/out/", webhook_url=receiver.url)
        job_id = store.create_job(spec, model_key="m", rows_total=1, output_schema="s",
                                  webhook_secret=generate_secret())
        event = final_event(store, job_id, JobStatus.FAILED, "boom")
        assert store.finish_job(job_id, JobStatus.FAILED, error="boom", event=event)
        stream = io.StringIO()
        handler = configure_logging("INFO", "json", stream=stream)
        try:
            with caplog.at_level(logging.INFO, logger="barge.webhooks"):
                policy = RetryPolicy()
                assert deliver_event(store, event.id, policy, allow_hosts=("127.0.0.1",)) is False   # 500
                store.outbox.replay(event.id)
                assert deliver_event(store, event.id, policy, allow_hosts=("127.0.0.1",)) is False   # 410
                logging.getLogger("barge.webhooks").warning("a careless line naming %s", receiver.url)
        finally:
            logging.getLogger().removeHandler(handler)
    assert receiver.paths == [path, path]   # sent to the whole URL, token and all
    host = f"http://127.0.0.1:{receiver.port}/***"
    delivery_lines = [r.getMessage() for r in caplog.records if "careless" not in r.getMessage()]
    assert any(f"to {host} attempt 1 failed: HTTP 500" in line for line in delivery_lines)
    assert any(f"HTTP 410 Gone from {host}" in line for line in delivery_lines)
    written = [json.loads(line)["message"] for line in stream.getvalue().splitlines()]
    assert f"a careless line naming {host}" in written
    for text in delivery_lines + written:
        assert SLACK_SECRET not in text and "T0LOCAL" not in text
