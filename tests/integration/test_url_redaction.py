"""URLs are shown without their query string or userinfo wherever Barge prints them
(storage.fs.redact): the webhook commands and job status, on a real SQLite store, with
a real receiver answering 410 so the endpoint listing has something to show."""

from __future__ import annotations

from jobs import cli
from jobs.events import final_event
from jobs.retention import PruneReport
from jobs.spec import JobSpec
from jobs.status import JobStatus
from queueing.dispatch import deliver_event
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
            cli.main(command)
            printed.append(capsys.readouterr())
    text = "".join(out.out + out.err for out in printed)
    assert f"127.0.0.1:{receiver.port}/hook?***" in text and "s3://***@bucket/out/?***" in text
    assert TOKEN not in text


def test_schedule_prune_report_hides_them_too():
    report = PruneReport(dry_run=True, outputs=[f"s3://key:{TOKEN}@bucket/out/"],
                         cache_files=[f"https://cache.example/c.parquet?sig={TOKEN}"])
    lines = "\n".join(report.lines())
    assert "s3://***@bucket/out/" in lines and "https://cache.example/c.parquet?***" in lines
    assert TOKEN not in lines
