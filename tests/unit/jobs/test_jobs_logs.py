"""Worker logs (jobs.logs): JSON lines with the job and shard, secrets redacted.

Given a logger configured the way `barge worker` configures it, when code logs, then
what reaches the stream is one JSON object per line, and no secret survives."""

from __future__ import annotations

import io
import json
import logging

import pytest

from jobs.logs import configure_logging, log_context, redact

SECRET = "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ="
AWS_KEY_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


@pytest.fixture
def logged():
    """Log through a configured handler; returns a function reading back the JSON lines."""
    stream = io.StringIO()
    handler = configure_logging("INFO", "json", stream=stream)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    logging.getLogger().removeHandler(handler)


def test_lines_logged_while_a_shard_runs_carry_its_job_and_shard(logged):
    log = logging.getLogger("barge.worker")
    with log_context(job_id="j1", shard_id=3):
        log.info("shard %s: %d rows", "committed", 40)
    log.info("between shards")
    inside, outside = logged()
    assert inside["message"] == "shard committed: 40 rows"
    assert (inside["job_id"], inside["shard_id"], inside["level"], inside["logger"]) == ("j1", 3, "INFO", "barge.worker")
    assert "job_id" not in outside and "shard_id" not in outside


def test_a_secret_in_a_field_is_redacted(logged):
    logging.getLogger("barge.webhooks").warning(
        "delivery failed", extra={"webhook_secret": SECRET, "detail": f"signed with {SECRET}",
                                  "headers": {"Authorization": "Bearer abc.def.ghi"}})
    [line] = logged()
    text = json.dumps(line)
    assert SECRET not in text and "abc.def.ghi" not in text
    assert line["webhook_secret"] == "***"
    assert line["detail"] == "signed with whsec_***"


def test_secrets_in_the_message_and_its_arguments_are_redacted(logged):
    log = logging.getLogger("barge.storage")
    log.error("reading %s failed", f"s3://{AWS_KEY_ID}:{AWS_SECRET}@bucket/key.parquet")
    log.error("broker at %s", "amqp://guest:hunter2@rabbit:5672//")
    log.error("env aws_secret_access_key=%s", AWS_SECRET)
    text = "\n".join(line["message"] for line in logged())
    for secret in (AWS_KEY_ID, AWS_SECRET, "hunter2"):
        assert secret not in text
    assert "amqp://***@rabbit:5672//" in text


def test_a_traceback_is_redacted_too(logged):
    try:
        raise RuntimeError(f"cannot sign with {SECRET}")
    except RuntimeError:
        logging.getLogger("barge.worker").exception("failed")
    [line] = logged()
    assert "RuntimeError" in line["exc"] and SECRET not in line["exc"]


def test_fields_named_like_row_content_are_dropped(logged):
    logging.getLogger("barge.worker").info("oops", extra={"text": "a private document", "body": b"{}"})
    [line] = logged()
    assert (line["text"], line["body"]) == ("[omitted]", "[omitted]")


@pytest.mark.parametrize("text, expected", [
    ("postgresql://barge:s3cret@db:5432/barge", "postgresql://***@db:5432/barge"),
    ("POST https://hooks.example.com/in?token=abc123 failed", "POST https://hooks.example.com/*** failed"),
    ("Authorization: Basic dXNlcjpwYXNz", "Authorization: ***"),
    ("password=letmein&user=x", "password=***&user=x"),
    ("nothing to hide in job 1234", "nothing to hide in job 1234"),
])
def test_redact(text, expected):
    assert redact(text) == expected


def test_the_text_format_names_the_shard():
    stream = io.StringIO()
    handler = configure_logging("INFO", "text", stream=stream)
    try:
        with log_context(job_id="j1", shard_id=0):
            logging.getLogger("barge.worker").info("with %s", SECRET)
    finally:
        logging.getLogger().removeHandler(handler)
    line = stream.getvalue()
    assert "barge.worker: [job j1 shard 0] with whsec_***" in line and SECRET not in line
