"""Standard Webhooks signing and verification (https://www.standardwebhooks.com/).

A signature is ``v1,<base64 HMAC-SHA256(key, "{msg_id}.{timestamp}." + body)>`` where the
key is the base64-decoded part of the secret after ``whsec_``. Everything here is pure:
no clock unless ``now`` is omitted, no I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Mapping, Sequence

SECRET_PREFIX = "whsec_"
SIGNATURE_VERSION = "v1"
NUM_SECRET_BYTES = 24

HEADER_ID = "webhook-id"
HEADER_TIMESTAMP = "webhook-timestamp"
HEADER_SIGNATURE = "webhook-signature"


class WebhookVerificationError(ValueError):
    """A webhook failed verification; the message says why (never the secret)."""


def generate_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(NUM_SECRET_BYTES)).decode("ascii")


def _secret_key(secret: str) -> bytes:
    # A secret without the prefix is taken as raw base64, as other Standard Webhooks
    # libraries do. The error must not echo the secret back.
    encoded = secret[len(SECRET_PREFIX):] if secret.startswith(SECRET_PREFIX) else secret
    try:
        key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("webhook secret is not valid base64") from None
    if not key:
        raise ValueError("webhook secret is empty")
    return key


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    signed_content = f"{msg_id}.{int(timestamp)}.".encode() + body
    digest = hmac.new(_secret_key(secret), signed_content, hashlib.sha256).digest()
    return f"{SIGNATURE_VERSION},{base64.b64encode(digest).decode('ascii')}"


def headers(secret: str | Sequence[str], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The Standard Webhooks headers; several secrets (a rotation) give one signature
    each, space-separated, so receivers holding either secret verify."""
    secrets_ = [secret] if isinstance(secret, str) else list(secret)
    if not secrets_:
        raise ValueError("no webhook secret to sign with")
    return {
        HEADER_ID: msg_id,
        HEADER_TIMESTAMP: str(int(timestamp)),
        HEADER_SIGNATURE: " ".join(sign(s, msg_id, timestamp, body) for s in secrets_),
        "content-type": "application/json",
    }


def verify(
    secret_or_secrets: str | list[str],
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance_s: int = 300,
    now: int | None = None,
) -> dict:
    """Check a delivery's signature and timestamp; return the parsed JSON payload.

    Several secrets may be given (the receiver's side of a rotation), and the
    signature header may hold several space-separated signatures (the sender's side);
    one match between them is enough.
    """
    msg_id, timestamp = _read_id_and_timestamp(headers)
    _check_timestamp(timestamp, tolerance_s, int(time.time()) if now is None else now)
    offered = _header(headers, HEADER_SIGNATURE).split()
    candidate_secrets = [secret_or_secrets] if isinstance(secret_or_secrets, str) else secret_or_secrets
    if not candidate_secrets:
        raise WebhookVerificationError("no secret to verify against")
    if not any(
        _matches_any(sign(secret, msg_id, timestamp, body), offered) for secret in candidate_secrets
    ):
        raise WebhookVerificationError("no matching signature")
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise WebhookVerificationError(f"body is not valid JSON: {exc}") from None


def _header(headers: Mapping[str, str], name: str) -> str:
    for key, value in headers.items():
        if key.lower() == name:
            if not value:
                break
            return value
    raise WebhookVerificationError(f"missing header {name}")


def _read_id_and_timestamp(headers: Mapping[str, str]) -> tuple[str, int]:
    msg_id = _header(headers, HEADER_ID)
    raw_timestamp = _header(headers, HEADER_TIMESTAMP)
    try:
        timestamp = int(raw_timestamp)
    except ValueError:
        raise WebhookVerificationError(f"bad timestamp {raw_timestamp[:32]!r}") from None
    return msg_id, timestamp


def _check_timestamp(timestamp: int, tolerance_s: int, now: int) -> None:
    if timestamp < now - tolerance_s:
        raise WebhookVerificationError(f"timestamp too old ({now - timestamp}s > {tolerance_s}s)")
    if timestamp > now + tolerance_s:
        raise WebhookVerificationError(f"timestamp too new ({timestamp - now}s > {tolerance_s}s)")


def _matches_any(expected: str, offered: list[str]) -> bool:
    # Compare every offered signature (no early exit) in constant time; signatures of
    # other versions simply never match.
    expected_bytes = expected.encode()
    is_match = False
    for signature in offered:
        is_match |= hmac.compare_digest(expected_bytes, signature.encode())
    return is_match
