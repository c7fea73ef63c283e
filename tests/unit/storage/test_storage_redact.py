"""storage.fs.redact, Barge's one URL redaction: userinfo and query strings never shown."""

from __future__ import annotations

import pytest

from storage.fs import describe, redact, redact_urls


@pytest.mark.parametrize("url, shown", [
    ("https://hooks.example.com/in?token=abc123", "https://hooks.example.com/in?***"),
    ("https://user:pw@hooks.example.com/in?token=abc#frag", "https://***@hooks.example.com/in?***#frag"),
    ("https://hooks.example.com/in", "https://hooks.example.com/in"),
    ("https://hooks.example.com/in?u=a@b", "https://hooks.example.com/in?***"),
    ("amqp://guest:guest@rabbit:5672//", "amqp://***@rabbit:5672//"),
    ("s3://bucket/key?versionId=3", "s3://bucket/key?***"),
    ("/local/what?.parquet", "/local/what?.parquet"),   # a path, not a URL
])
def test_redact_hides_userinfo_and_query(url, shown):
    assert redact(url) == shown


def test_redact_urls_inside_a_text():
    text = "POST https://h.example/in?token=abc failed; broker amqp://guest:pw@rabbit:5672// down"
    assert redact_urls(text) == "POST https://h.example/in?*** failed; broker amqp://***@rabbit:5672// down"


def test_describe_takes_a_presigned_signature_out_of_a_backend_error():
    error = OSError("GET https://bucket.s3.example/key?X-Amz-Signature=deadbeef returned 403")
    assert "deadbeef" not in describe(error) and "https://bucket.s3.example/key?***" in describe(error)


@pytest.mark.parametrize("url, shown", [
    ("s3://AKIAEXAMPLE:wJalr/K7MDENG/bPxR@bucket/key.parquet", "s3://***@bucket/key.parquet"),
    ("https://hooks.example.com:8443/in/x?email=a@b", "https://hooks.example.com:8443/in/x?***"),
])
def test_redact_a_password_with_slashes_and_an_at_sign_in_the_query(url, shown):
    assert redact(url) == shown
