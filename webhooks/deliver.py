"""Send one signed webhook and describe what happened.

``send`` is the edge with side effects: it never raises for network trouble and
reports everything in a DeliveryResult, so the delivery task only has to record it and
decide on a retry with ``webhooks.retry.next_delay``.
"""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.request
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from webhooks import signing
from webhooks.connection import ConnectTimeout, build_opener
from webhooks.events import WebhookEvent
from webhooks.retry import parse_retry_after, retry_delay  # noqa: F401  (retry_delay: re-exported)
from webhooks.safety import UnsafeDestinationError, checked_addresses

USER_AGENT = "Barge-Webhooks/1"


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
    secret: str | Sequence[str],
    *,
    timeout_s: float = 10.0,
    connect_timeout_s: float | None = None,
    allow_hosts: Collection[str] = (),
    now: int | None = None,
) -> DeliveryResult:
    """POST the event's body with Standard Webhooks headers: check → sign → post.

    The connection goes only to the addresses the destination check approved (see
    webhooks.connection), never through a proxy, and never follows a redirect: a 3xx
    is a failed attempt, so a redirect can never lead to an unchecked address.
    ``timeout_s`` bounds each read; ``connect_timeout_s`` (default: ``timeout_s``) connecting.
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
        opener = build_opener(addresses, connect_timeout_s=connect_timeout_s)
        with opener.open(request, timeout=timeout_s) as response:
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
        if isinstance(exc.reason, ConnectTimeout):
            return result(ok=False, error=f"timeout: {exc.reason}")
        if isinstance(exc.reason, TimeoutError):
            return result(ok=False, error=f"timeout: sending timed out after {timeout_s}s")
        return result(ok=False, error=f"request failed: {_describe(exc.reason)}")
    except TimeoutError:
        return result(ok=False, error=f"timeout: read timed out after {timeout_s}s")
    except (OSError, http.client.HTTPException) as exc:
        return result(ok=False, error=f"request failed: {_describe(exc)}")


def _http_error_text(status_code: int, reason: str) -> str:
    if 300 <= status_code < 400:
        return f"HTTP {status_code} redirect not followed"
    return f"HTTP {status_code} {reason}".rstrip()


def _describe(exc: object) -> str:
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, str) else f"{type(exc).__name__}: {text}"


def _redact(text: str, secret: str | Sequence[str]) -> str:
    # Belt and braces: nothing above formats the secret, but exception text from a
    # lower layer might one day include request details.
    for one in [secret] if isinstance(secret, str) else secret:
        if one:
            text = text.replace(one, "[secret]")
            if one.startswith(signing.SECRET_PREFIX) and len(one) > len(signing.SECRET_PREFIX):
                text = text.replace(one[len(signing.SECRET_PREFIX):], "[secret]")
    return text
