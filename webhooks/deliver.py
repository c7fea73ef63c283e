"""Send one signed webhook and describe what happened; plus the pure retry policy.

``send`` is the edge with side effects: it never raises for network trouble and
reports everything in a DeliveryResult, so the delivery task only has to record it and
decide on a retry with ``retry_delay``.
"""

from __future__ import annotations

import http.client
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from webhooks import signing
from webhooks.connection import build_opener
from webhooks.events import WebhookEvent
from webhooks.safety import UnsafeDestinationError, checked_addresses

USER_AGENT = "Barge-Webhooks/1"
MAX_BACKOFF_EXPONENT = 62  # keeps base_s * 2**n a finite float for any attempt number


@dataclass(frozen=True)
class DeliveryResult:
    """The outcome of one delivery attempt."""

    ok: bool  # the receiver answered 2xx
    status_code: int | None  # HTTP status, None when no response arrived
    error: str | None  # why it failed, None when ok; never contains the secret
    latency_s: float  # wall time of the attempt, including the destination check
    retry_after_s: float | None  # the receiver's Retry-After, in seconds from now
    is_permanent: bool  # do not retry: 410 Gone, unsafe destination, unusable secret


def send(
    url: str,
    event: WebhookEvent,
    secret: str,
    *,
    timeout_s: float = 10.0,
    allow_hosts: Collection[str] = (),
    now: int | None = None,
) -> DeliveryResult:
    """POST the event's body with Standard Webhooks headers: check → sign → post.

    The connection goes only to the addresses the destination check approved (see
    webhooks.connection), never through a proxy, and never follows a redirect.
    """
    started = time.monotonic()

    def result(**fields) -> DeliveryResult:
        fields.setdefault("status_code", None)
        fields.setdefault("retry_after_s", None)
        fields.setdefault("is_permanent", False)
        if fields.get("error") is not None:
            fields["error"] = _redact(fields["error"], secret)
        return DeliveryResult(latency_s=time.monotonic() - started, **fields)

    try:
        addresses = checked_addresses(url, allow_hosts=allow_hosts)
    except UnsafeDestinationError as exc:
        return result(ok=False, error=f"unsafe destination: {exc}", is_permanent=True)
    except OSError as exc:
        return result(ok=False, error=f"cannot resolve host: {_describe(exc)}")

    body = event.body()
    timestamp = int(time.time()) if now is None else now
    try:
        signed_headers = signing.headers(secret, event.event_id, timestamp, body)
    except ValueError:
        return result(ok=False, error="webhook secret is unusable", is_permanent=True)

    request = urllib.request.Request(url, data=body, method="POST")
    for name, value in {**signed_headers, "user-agent": USER_AGENT}.items():
        request.add_header(name, value)
    try:
        with build_opener(addresses).open(request, timeout=timeout_s) as response:
            return result(ok=True, status_code=response.status, error=None)
    except urllib.error.HTTPError as exc:
        with exc:
            return result(
                ok=False,
                status_code=exc.code,
                error=_http_error_text(exc.code, exc.reason),
                retry_after_s=parse_retry_after(exc.headers.get("Retry-After"), now=time.time()),
                is_permanent=exc.code == 410,
            )
    except urllib.error.URLError as exc:
        return result(ok=False, error=f"request failed: {_describe(exc.reason)}")
    except (OSError, http.client.HTTPException) as exc:
        return result(ok=False, error=f"request failed: {_describe(exc)}")


def retry_delay(
    attempt: int,
    *,
    base_s: float = 5.0,
    cap_s: float = 3600.0,
    retry_after_s: float | None = None,
    rng: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1 for the first).

    Exponential backoff with full jitter: uniform in [0, min(cap, base * 2**(attempt-1))).
    A receiver's Retry-After wins over the backoff, still clamped to ``cap_s`` so one
    receiver cannot park a delivery for days.
    """
    if attempt < 1:
        raise ValueError(f"attempt: must be >= 1, got {attempt}")
    if retry_after_s is not None:
        return min(max(float(retry_after_s), 0.0), cap_s)
    ceiling = min(cap_s, base_s * 2.0 ** min(attempt - 1, MAX_BACKOFF_EXPONENT))
    return rng() * ceiling


def parse_retry_after(value: str | None, *, now: float) -> float | None:
    """Retry-After as seconds from ``now``: delta-seconds or an HTTP-date; None if absent/bad."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(when.timestamp() - now, 0.0)


def _http_error_text(status_code: int, reason: str) -> str:
    if 300 <= status_code < 400:
        return f"HTTP {status_code} redirect not followed"
    return f"HTTP {status_code} {reason}".rstrip()


def _describe(exc: object) -> str:
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, str) else f"{type(exc).__name__}: {text}"


def _redact(text: str, secret: str) -> str:
    # Belt and braces: nothing above formats the secret, but exception text from a
    # lower layer might one day include request details.
    if secret:
        text = text.replace(secret, "[secret]")
        if secret.startswith(signing.SECRET_PREFIX) and len(secret) > len(signing.SECRET_PREFIX):
            text = text.replace(secret[len(signing.SECRET_PREFIX):], "[secret]")
    return text
