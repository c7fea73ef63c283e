"""storage.redaction, Barge's one redaction: what the CLI, the dashboard and the logs
may show of a URL, a text or a JSON value."""

from __future__ import annotations

import pytest

from storage.fs import describe, redact, redact_urls
from storage.redaction import HIDDEN, redact_text, redact_url, redact_value

SLACK = "https://hooks.slack.com/services/T0AAAAAAA/B0BBBBBBB/slack-path-secret"


@pytest.mark.parametrize("url, shown", [
    # web URLs: userinfo, query and path masked (a receiver's token is often the path)
    (SLACK, "https://hooks.slack.com/***"),
    ("https://discord.com/api/webhooks/123/discord-token", "https://discord.com/***"),
    ("https://hooks.example.com/in?token=abc123", "https://hooks.example.com/***"),
    ("https://user:pw@hooks.example.com/in?token=abc#frag", "https://***@hooks.example.com/***"),
    ("https://hooks.example.com:8443/in/x?email=a@b", "https://hooks.example.com:8443/***"),
    ("https://h.example?token=abc", "https://h.example/***"),
    ("wss://stream.example/socket/abc", "wss://stream.example/***"),
    ("http://127.0.0.1:9000/", "http://127.0.0.1:9000/"),   # a bare "/" hides nothing
    ("http://127.0.0.1:9000", "http://127.0.0.1:9000"),
    # storage, database and broker URLs: the path is a location the user must see
    ("s3://bucket/key?versionId=3", "s3://bucket/key?***"),
    ("s3://bucket/out/part-0.parquet?X-Amz-Signature=deadbeef#v", "s3://bucket/out/part-0.parquet?***#v"),
    ("s3://AKIAEXAMPLE:wJalr/K7MDENG/bPxR@bucket/key.parquet", "s3://***@bucket/key.parquet"),
    ("s3://bucket/key@v1", "s3://bucket/key@v1"),
    ("gs://bucket/a/b.parquet", "gs://bucket/a/b.parquet"),
    ("az://container/a.parquet?sv=2022&sig=abc", "az://container/a.parquet?***"),
    ("hf://datasets/org/name/data/train.parquet", "hf://datasets/org/name/data/train.parquet"),
    ("file:///data/in/a.parquet", "file:///data/in/a.parquet"),
    ("amqp://guest:guest@rabbit:5672//", "amqp://***@rabbit:5672//"),
    ("postgresql+psycopg://barge:s3cret@db:5432/barge", "postgresql+psycopg://***@db:5432/barge"),
    # not URLs: shown as they are
    ("/local/what?.parquet", "/local/what?.parquet"),
    ("/local/a@b.parquet", "/local/a@b.parquet"),
    ("not a url", "not a url"),
])
def test_a_url_as_shown(url, shown):
    assert redact_url(url) == shown
    assert redact(url) == shown   # storage.fs's name for it
    assert redact_url(shown) == shown   # redacting twice changes nothing


@pytest.mark.parametrize("text, shown", [
    ("POST https://h.example/in?token=abc failed; broker amqp://guest:pw@rabbit:5672// down",
     "POST https://h.example/*** failed; broker amqp://***@rabbit:5672// down"),
    (f"HTTP 500 from {SLACK} after 0.2s", "HTTP 500 from https://hooks.slack.com/*** after 0.2s"),
    ("could not read s3://AKIAOWNED:s3-secret@corpus/a.parquet?sig=1: 403",
     "could not read s3://***@corpus/a.parquet?***: 403"),
    ("signed with whsec_c2VjcmV0LXNlY3JldA==", "signed with whsec_***"),
    ("key id AKIAIOSFODNN7EXAMPLE refused", f"key id {HIDDEN} refused"),
    ("Authorization: Bearer abc.def.ghi", "Authorization: ***"),
    ("error: password=letmein&user=x", "error: password=***&user=x"),
    ("aws_secret_access_key=wJalrXUtnFEMI/K7MDENG+bPxR", "aws_secret_access_key=***"),
    ('{"api_key": "sk live 1", "x-api-key": "k2", "max_tokens": 8}',
     '{"api_key": "***", "x-api-key": "***", "max_tokens": 8}'),
    ("{'hf_token': 'hf_abc', 'stop_token_ids': [2]}", "{'hf_token': '***', 'stop_token_ids': [2]}"),
    ("shard 3: 40 rows, max_tokens=64, num_prompt_tokens: 12",
     "shard 3: 40 rows, max_tokens=64, num_prompt_tokens: 12"),
])
def test_a_text_as_shown(text, shown):
    assert redact_text(text) == shown
    assert redact_urls(text) == shown


def test_none_stays_none():
    assert redact_text(None) is None and redact_value(None) is None


def test_secret_names_are_hidden_at_any_depth_and_sampling_params_stay():
    spec = {"input": ["s3://AKIAEXAMPLE:wJalrSECRET@corpus/a.parquet", "/data/b.parquet"],
            "output": "s3://bucket/out/?X-Amz-Signature=deadbeef",
            "webhook_url": SLACK,
            "metadata": {"api_key": "sk-live-1", "auth_token": "t0k-9", "team": "search", "token": "t-1",
                         "access_token": "at-1", "notify": "https://hooks.example.com/T1/B2/notify-token",
                         "aws_secret_access_key": "aws-secret-1", "webhook_secret": "whsec_abc",
                         "nested": {"password": "hunter2", "n": 3,
                                    "deeper": [{"apiKey": "camel-1", "Private_Key": "pk"}]},
                         "headers": {"Authorization": "Bearer hdr-1", "X-API-Key": "hdr-2", "X-Signature": "hdr-3",
                                     "Content-Type": "application/json"},
                         "empty_secret": None},
            "params": {"max_tokens": 8, "max_completion_tokens": 16, "stop_token_ids": [2], "top_logprobs": 3,
                       "temperature": 0.0}}
    shown = redact_value(spec)
    text = repr(shown)
    for secret in ("wJalrSECRET", "AKIAEXAMPLE", "deadbeef", "slack-path-secret", "sk-live-1", "t0k-9", "t-1",
                   "at-1", "notify-token", "aws-secret-1", "whsec_abc", "hunter2", "camel-1", "'pk'", "hdr-1", "hdr-2",
                   "hdr-3"):
        assert secret not in text
    assert shown["input"] == ["s3://***@corpus/a.parquet", "/data/b.parquet"]
    assert shown["output"] == "s3://bucket/out/?***" and shown["webhook_url"] == "https://hooks.slack.com/***"
    assert shown["metadata"]["notify"] == "https://hooks.example.com/***" and shown["metadata"]["team"] == "search"
    assert shown["metadata"]["nested"]["n"] == 3 and shown["metadata"]["empty_secret"] is None
    assert shown["metadata"]["headers"]["Content-Type"] == "application/json"
    assert shown["params"] == spec["params"]


def test_describe_takes_a_presigned_signature_out_of_a_backend_error():
    error = OSError("GET https://bucket.s3.example/key?X-Amz-Signature=deadbeef returned 403")
    assert "deadbeef" not in describe(error) and "https://bucket.s3.example/***" in describe(error)


def test_the_id_of_a_key_is_shown_and_the_key_is_not():
    shown = redact_value({"api_key_id": "key_0f3a9c", "api_key": "sk-barge-live", "apiKeyId": "key_1",
                          "aws_access_key_id": "AKIAIOSFODNN7EXAMPLE", "client_secret_key_id": "s-1"})
    assert shown["api_key_id"] == "key_0f3a9c" and shown["apiKeyId"] == "key_1"   # whose batch it is
    assert shown["api_key"] == HIDDEN
    assert shown["aws_access_key_id"] == HIDDEN   # not by its name: by its AKIA shape
    assert shown["client_secret_key_id"] == HIDDEN   # a name that says secret stays one
    assert redact_text("owner api_key_id=key_0f3a9c, api_key=sk-1") == "owner api_key_id=key_0f3a9c, api_key=***"
