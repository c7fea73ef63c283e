"""The chaos soak's fault schedule (tests.support.chaos_schedule): a pure function of the
seed, every kind the profile asks for, inside its window, and never two faults of one
kind at once (a service is never stopped while it is already down)."""

import pytest

from tests.support.chaos_schedule import FULL, SHORT, FaultKind, plan_faults


@pytest.mark.parametrize("profile", [FULL, SHORT], ids=["full", "short"])
def test_a_seed_gives_one_schedule_with_every_kind_apart_and_in_its_window(profile):
    schedule = plan_faults(27, profile)
    assert schedule == plan_faults(27, profile) != plan_faults(28, profile)
    assert [fault.at_s for fault in schedule] == sorted(fault.at_s for fault in schedule)
    for kind in FaultKind:
        faults = [fault for fault in schedule if fault.kind is kind]
        assert len(faults) == profile.counts[kind]
        first, last = profile.window_s
        assert all(first <= fault.at_s <= last for fault in faults)
        for earlier, later in zip(faults, faults[1:]):
            assert earlier.at_s + earlier.duration_s <= later.at_s, f"two {kind.value} faults overlap"
        if kind.value.startswith("s3"):
            assert all(profile.s3_burst_sizes[0] <= fault.size <= profile.s3_burst_sizes[1] for fault in faults)
