import base64
import hashlib
import hmac
import json

import pytest

from webhooks.signing import WebhookVerificationError, generate_secret, headers, sign, verify

KEY = bytes(range(24))
SECRET = "whsec_" + base64.b64encode(KEY).decode()
MSG_ID = "msg_0123456789abcdef"
NOW = 1_700_000_000
BODY = b'{"data":{"job_id":"job_1"},"type":"job.succeeded"}'


def signed_headers(secret=SECRET, msg_id=MSG_ID, timestamp=NOW, body=BODY):
    return headers(secret, msg_id, timestamp, body)


def test_generate_secret_is_prefixed_base64_of_24_bytes():
    secret = generate_secret()
    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret.removeprefix("whsec_"), validate=True)) == 24
    assert generate_secret() != secret


def test_sign_matches_independent_hmac():
    # Given a known key, id, timestamp and body, computed here without sign()
    digest = hmac.new(KEY, f"{MSG_ID}.{NOW}.".encode() + BODY, hashlib.sha256).digest()
    expected = "v1," + base64.b64encode(digest).decode()
    # Then sign() gives the same signature
    assert sign(SECRET, MSG_ID, NOW, BODY) == expected


def test_standard_webhooks_reference_vector():
    # The example from the Standard Webhooks spec / reference libraries.
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    msg_id = "msg_p5jXN8AQM9LWM0D4loKWxJek"
    timestamp = 1614265330
    body = b'{"test": 2432232314}'
    assert sign(secret, msg_id, timestamp, body) == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_headers_carry_id_timestamp_signature_and_content_type():
    result = signed_headers()
    assert result == {
        "webhook-id": MSG_ID,
        "webhook-timestamp": str(NOW),
        "webhook-signature": sign(SECRET, MSG_ID, NOW, BODY),
        "content-type": "application/json",
    }


def test_roundtrip_returns_payload():
    assert verify(SECRET, signed_headers(), BODY, now=NOW) == json.loads(BODY)


def test_header_lookup_is_case_insensitive():
    upper = {name.upper(): value for name, value in signed_headers().items()}
    assert verify(SECRET, upper, BODY, now=NOW)["type"] == "job.succeeded"


def test_secret_without_prefix_is_raw_base64():
    raw = SECRET.removeprefix("whsec_")
    assert sign(raw, MSG_ID, NOW, BODY) == sign(SECRET, MSG_ID, NOW, BODY)
    assert verify(raw, signed_headers(), BODY, now=NOW)


@pytest.mark.parametrize(
    "field, value",
    [("body", BODY.replace(b"job_1", b"job_2")), ("webhook-id", "msg_other"), ("webhook-timestamp", str(NOW + 1))],
)
def test_tampering_fails(field, value):
    sent_headers, body = signed_headers(), BODY
    if field == "body":
        body = value
    else:
        sent_headers[field] = value
    with pytest.raises(WebhookVerificationError, match="no matching signature"):
        verify(SECRET, sent_headers, body, now=NOW)


def test_wrong_secret_fails():
    with pytest.raises(WebhookVerificationError, match="no matching signature"):
        verify(generate_secret(), signed_headers(), BODY, now=NOW)


@pytest.mark.parametrize(
    "now, reason", [(NOW + 301, "too old"), (NOW - 301, "too new")]
)
def test_timestamp_outside_tolerance_fails(now, reason):
    with pytest.raises(WebhookVerificationError, match=reason):
        verify(SECRET, signed_headers(), BODY, now=now)


def test_timestamp_at_tolerance_edge_passes():
    assert verify(SECRET, signed_headers(), BODY, now=NOW + 300, tolerance_s=300)


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_missing_header_is_named(missing):
    sent_headers = signed_headers()
    del sent_headers[missing]
    with pytest.raises(WebhookVerificationError, match=f"missing header {missing}"):
        verify(SECRET, sent_headers, BODY, now=NOW)


def test_bad_timestamp_fails():
    sent_headers = signed_headers()
    sent_headers["webhook-timestamp"] = "yesterday"
    with pytest.raises(WebhookVerificationError, match="bad timestamp"):
        verify(SECRET, sent_headers, BODY, now=NOW)


def test_rotation_any_offered_signature_may_match():
    # Given a sender signing with an old and a new secret
    old_secret, new_secret = generate_secret(), SECRET
    sent_headers = signed_headers()
    sent_headers["webhook-signature"] = " ".join(
        [sign(old_secret, MSG_ID, NOW, BODY), "v2,ignored", sign(new_secret, MSG_ID, NOW, BODY)]
    )
    # Then a receiver knowing either secret accepts it
    assert verify(new_secret, sent_headers, BODY, now=NOW)
    assert verify(old_secret, sent_headers, BODY, now=NOW)


def test_rotation_receiver_may_hold_several_secrets():
    assert verify([generate_secret(), SECRET], signed_headers(), BODY, now=NOW)
    with pytest.raises(WebhookVerificationError):
        verify([generate_secret(), generate_secret()], signed_headers(), BODY, now=NOW)


def test_verification_error_is_a_value_error_and_hides_secret():
    with pytest.raises(ValueError) as info:
        verify(SECRET, {**signed_headers(), "webhook-signature": "v1,AAAA"}, BODY, now=NOW)
    assert SECRET not in str(info.value)
    assert SECRET.removeprefix("whsec_") not in str(info.value)


def test_invalid_secret_raises_value_error_without_echoing_it():
    with pytest.raises(ValueError) as info:
        sign("whsec_not*base64!", MSG_ID, NOW, BODY)
    assert "not*base64" not in str(info.value)
