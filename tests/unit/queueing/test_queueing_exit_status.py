"""The worker's exit status: zero only after a drain it was asked for (queueing.serve)."""

from __future__ import annotations

import pytest

from queueing.serve import _exit_status


@pytest.mark.parametrize("celery_status, was_draining, expected", [
    (0, True, 0),      # SIGTERM or SIGINT, drained: the one clean exit
    (0, False, 1),     # Celery returned without being asked to: not a success
    (1, False, 1),     # Celery's unrecoverable error
    (1, True, 1),
])
def test_the_worker_exits_zero_only_after_a_drain(celery_status, was_draining, expected):
    assert _exit_status(celery_status, was_draining) == expected
