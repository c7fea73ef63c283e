"""Job and shard state machines: every pair of states checked against the tables."""

from __future__ import annotations

import itertools

import pytest

from jobs.status import (JOB_TRANSITIONS, SHARD_TRANSITIONS, InvalidTransition, JobStatus, ShardStatus,
                         can_transition, check_transition)

# The allowed transitions, written out here independently of the module's tables.
ALLOWED_JOB = {
    (JobStatus.QUEUED, JobStatus.RUNNING), (JobStatus.QUEUED, JobStatus.FAILED),
    (JobStatus.QUEUED, JobStatus.CANCELLED), (JobStatus.QUEUED, JobStatus.EXPIRED),
    (JobStatus.RUNNING, JobStatus.FINALIZING), (JobStatus.RUNNING, JobStatus.FAILED),
    (JobStatus.RUNNING, JobStatus.CANCELLED), (JobStatus.RUNNING, JobStatus.EXPIRED),
    (JobStatus.FINALIZING, JobStatus.SUCCEEDED), (JobStatus.FINALIZING, JobStatus.FAILED),
    # Client.retry re-opens a failed, cancelled or expired job.
    (JobStatus.FAILED, JobStatus.RUNNING), (JobStatus.FAILED, JobStatus.QUEUED),
    (JobStatus.CANCELLED, JobStatus.RUNNING), (JobStatus.CANCELLED, JobStatus.QUEUED),
    (JobStatus.EXPIRED, JobStatus.RUNNING), (JobStatus.EXPIRED, JobStatus.QUEUED),
}
ALLOWED_SHARD = {
    (ShardStatus.PENDING, ShardStatus.RUNNING), (ShardStatus.PENDING, ShardStatus.CANCELLED),
    (ShardStatus.RUNNING, ShardStatus.RUNNING), (ShardStatus.RUNNING, ShardStatus.PENDING),
    (ShardStatus.RUNNING, ShardStatus.COMMITTED), (ShardStatus.RUNNING, ShardStatus.FAILED),
    (ShardStatus.RUNNING, ShardStatus.CANCELLED),
    (ShardStatus.FAILED, ShardStatus.PENDING), (ShardStatus.CANCELLED, ShardStatus.PENDING),
}

JOB_PAIRS = list(itertools.product(JobStatus, repeat=2))
SHARD_PAIRS = list(itertools.product(ShardStatus, repeat=2))


def _pair_id(pair) -> str:
    return f"{pair[0]}->{pair[1]}"


def test_the_tables_match_the_written_out_transitions():
    assert {(a, b) for a, targets in JOB_TRANSITIONS.items() for b in targets} == ALLOWED_JOB
    assert {(a, b) for a, targets in SHARD_TRANSITIONS.items() for b in targets} == ALLOWED_SHARD
    assert set(JOB_TRANSITIONS) == set(JobStatus)
    assert set(SHARD_TRANSITIONS) == set(ShardStatus)


@pytest.mark.parametrize("pair", JOB_PAIRS + SHARD_PAIRS, ids=_pair_id)
def test_every_pair_is_allowed_or_refused_as_the_table_says(pair):
    current, target = pair
    # Compare within one kind: the enums are IntEnums, so JobStatus.RUNNING == ShardStatus.RUNNING.
    is_allowed = pair in (ALLOWED_JOB if isinstance(current, JobStatus) else ALLOWED_SHARD)
    assert can_transition(current, target) is is_allowed
    if is_allowed:
        check_transition(current, target)
    else:
        with pytest.raises(InvalidTransition) as caught:
            check_transition(current, target)
        kind = "job" if isinstance(current, JobStatus) else "shard"
        assert str(caught.value) == f"{kind} cannot go from {current} to {target}"


def test_invalid_transition_is_a_value_error():
    assert issubclass(InvalidTransition, ValueError)


@pytest.mark.parametrize("status", list(JobStatus) + list(ShardStatus), ids=str)
def test_a_finished_state_has_no_way_out_but_a_retry(status):
    table = JOB_TRANSITIONS if isinstance(status, JobStatus) else SHARD_TRANSITIONS
    if not status.is_finished:
        assert table[status]
    elif status is JobStatus.SUCCEEDED or status is ShardStatus.COMMITTED:
        assert not table[status]
    else:   # only Client.retry leaves it: a job re-opens, a shard goes back to pending
        retry_targets = {JobStatus.RUNNING, JobStatus.QUEUED} if isinstance(status, JobStatus) else {ShardStatus.PENDING}
        assert set(table[status]) == retry_targets


def test_job_is_finished_from_succeeded_on():
    assert [s for s in JobStatus if s.is_finished] == [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED,
                                                       JobStatus.EXPIRED]
    assert list(JobStatus) == sorted(JobStatus)
    assert all(s < JobStatus.SUCCEEDED for s in JobStatus if not s.is_finished)


def test_shard_is_finished_from_committed_on():
    assert [s for s in ShardStatus if s.is_finished] == [ShardStatus.COMMITTED, ShardStatus.FAILED,
                                                         ShardStatus.CANCELLED]
    assert all(s < ShardStatus.COMMITTED for s in ShardStatus if not s.is_finished)


def test_states_print_as_lower_case_names():
    assert str(JobStatus.FINALIZING) == "finalizing"
    assert str(ShardStatus.COMMITTED) == "committed"
    assert f"{JobStatus.QUEUED}" == "queued"
