"""The pure retry policy: given an attempt's outcome, when (if ever) to try again."""

import pytest

from webhooks.retry import RetryPolicy, max_span_s, next_delay

POLICY = RetryPolicy(base_s=1.0, cap_s=100.0, max_attempts=5)


@pytest.mark.parametrize(
    "attempt, status_code, retry_after_s, is_permanent, expected",
    [
        (1, 500, None, False, 1.0),          # backoff ceiling, rng at 1
        (3, None, None, False, 4.0),         # no answer (timeout, refused): backoff
        (4, 500, 30.0, False, 8.0),          # Retry-After on a 500 is not honoured
        (1, 429, 30.0, False, 30.0),         # 429 and 503 honour Retry-After
        (1, 503, 30.0, False, 30.0),
        (1, 429, 9999.0, False, 100.0),      # ... clamped to the cap
        (1, 429, None, False, 1.0),          # 429 without Retry-After: backoff
        (1, 410, None, True, None),          # 410 Gone: stop
        (1, None, None, True, None),         # unsafe destination, unusable secret: stop
        (4, 500, None, False, 8.0),
        (5, 500, None, False, None),         # the last attempt of the series
        (5, 429, 1.0, False, None),
    ],
)
def test_next_delay(attempt, status_code, retry_after_s, is_permanent, expected):
    delay = next_delay(POLICY, attempt, status_code=status_code, retry_after_s=retry_after_s,
                       is_permanent=is_permanent, rng=lambda: 1.0)
    assert delay == expected


def test_default_schedule_spans_about_three_days():
    policy = RetryPolicy()
    # Full jitter: the expected span is half the sum of the ceilings.
    assert 2.5 * 86400 < max_span_s(policy) / 2 < 3.5 * 86400
    assert policy.lease_s > policy.connect_timeout_s + policy.read_timeout_s


def test_policy_from_env():
    policy = RetryPolicy.from_env({"BARGE_WEBHOOK_RETRY_BASE_S": "0.2", "BARGE_WEBHOOK_MAX_ATTEMPTS": "4",
                                   "BARGE_WEBHOOK_TIMEOUT_S": "2", "BARGE_WEBHOOK_RETRY_CAP_S": "60"})
    assert (policy.base_s, policy.max_attempts, policy.read_timeout_s, policy.cap_s) == (0.2, 4, 2.0, 60.0)
    assert policy.connect_timeout_s == 2.0     # never longer than the read timeout unless set
    assert RetryPolicy.from_env({}) == RetryPolicy()


@pytest.mark.parametrize("field, value", [("base_s", 0), ("cap_s", -1.0), ("max_attempts", 0),
                                          ("max_attempts", True), ("read_timeout_s", "5")])
def test_policy_refuses_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        RetryPolicy(**{field: value})
