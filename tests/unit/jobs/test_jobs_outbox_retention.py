"""How long settled webhook events are kept: BARGE_OUTBOX_RETENTION_S and --older-than."""

from __future__ import annotations

import pytest

from jobs.outbox import parse_duration, retention_from_env


@pytest.mark.parametrize("text, seconds", [
    ("30d", 30 * 86_400.0), ("12h", 43_200.0), ("90m", 5_400.0), ("3600s", 3_600.0), ("3600", 3_600.0),
    ("0", 0.0), ("1.5D", 129_600.0),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "d", "a while", "-1h", "nan", "3w"])
def test_parse_duration_refuses(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_retention_from_env():
    assert retention_from_env({}) is None
    assert retention_from_env({"BARGE_OUTBOX_RETENTION_S": "7d"}) == 7 * 86_400.0
    with pytest.raises(ValueError, match="BARGE_OUTBOX_RETENTION_S"):
        retention_from_env({"BARGE_OUTBOX_RETENTION_S": "soon"})
