"""When to try a webhook again: the pure retry policy, table-tested.

NOTE: the schedule is exponential backoff with full jitter, uniform in
[0, min(cap, base * 2**(attempt-1))), so the expected wait is half the ceiling. With
the defaults (5 s base, 6 h cap, 36 attempts) the ceilings sum to about six days and
the expected span from the first to the last attempt is about three days (± some
hours): a receiver that is down over a long weekend still gets its events.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

MAX_BACKOFF_EXPONENT = 62  # keeps base_s * 2**n a finite float for any attempt number
RETRY_AFTER_STATUSES = (429, 503)  # the statuses whose Retry-After we honour

DEFAULT_RETRY_BASE_S = 5.0
DEFAULT_RETRY_CAP_S = 6 * 3600.0
DEFAULT_MAX_ATTEMPTS = 36
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_READ_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class RetryPolicy:
    """How one webhook event is retried, and how long one attempt may take."""

    base_s: float = DEFAULT_RETRY_BASE_S  # ceiling of the first retry's delay
    cap_s: float = DEFAULT_RETRY_CAP_S  # no single delay (Retry-After included) exceeds this
    max_attempts: int = DEFAULT_MAX_ATTEMPTS  # attempts per series (a replay starts a new series)
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S  # per socket read while waiting for the answer
    lease_margin_s: float = 30.0  # how much longer than the slowest attempt a claim is held

    def __post_init__(self) -> None:
        for name in ("base_s", "cap_s", "connect_timeout_s", "read_timeout_s", "lease_margin_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"{name}: must be a positive number, got {value!r}")
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ValueError(f"max_attempts: must be a positive integer, got {self.max_attempts!r}")

    @property
    def lease_s(self) -> float:
        # A claim must outlast the slowest attempt, or a second dispatcher could send
        # the same event concurrently; after a crash the event is due again this soon.
        return self.connect_timeout_s + self.read_timeout_s + self.lease_margin_s

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> RetryPolicy:
        read_timeout_s = float(environ.get("BARGE_WEBHOOK_TIMEOUT_S", DEFAULT_READ_TIMEOUT_S))
        return cls(
            base_s=float(environ.get("BARGE_WEBHOOK_RETRY_BASE_S", DEFAULT_RETRY_BASE_S)),
            cap_s=float(environ.get("BARGE_WEBHOOK_RETRY_CAP_S", DEFAULT_RETRY_CAP_S)),
            max_attempts=int(environ.get("BARGE_WEBHOOK_MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS)),
            connect_timeout_s=float(environ.get("BARGE_WEBHOOK_CONNECT_TIMEOUT_S",
                                                min(DEFAULT_CONNECT_TIMEOUT_S, read_timeout_s))),
            read_timeout_s=read_timeout_s,
        )


def next_delay(
    policy: RetryPolicy,
    attempt_in_series: int,
    *,
    status_code: int | None,
    retry_after_s: float | None,
    is_permanent: bool,
    rng: Callable[[], float] = random.random,
) -> float | None:
    """Seconds until the next attempt after a failed one; None to give up.

    ``attempt_in_series`` counts from 1 since the event was created or last replayed.
    """
    if is_permanent or attempt_in_series >= policy.max_attempts:
        return None
    honoured = retry_after_s if status_code in RETRY_AFTER_STATUSES else None
    return retry_delay(attempt_in_series, base_s=policy.base_s, cap_s=policy.cap_s,
                       retry_after_s=honoured, rng=rng)


def retry_delay(
    attempt: int,
    *,
    base_s: float = DEFAULT_RETRY_BASE_S,
    cap_s: float = DEFAULT_RETRY_CAP_S,
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


def max_span_s(policy: RetryPolicy) -> float:
    """The longest time from the first to the last attempt of a series (every jitter at 1)."""
    return sum(min(policy.cap_s, policy.base_s * 2.0 ** min(n - 1, MAX_BACKOFF_EXPONENT))
               for n in range(1, policy.max_attempts))


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
