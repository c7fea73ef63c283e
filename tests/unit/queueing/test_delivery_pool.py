"""The dispatcher's pure choice of which due webhook events to start (queueing.delivery_pool)."""

from __future__ import annotations

import pytest

from queueing.delivery_pool import DeliveryLimits, host_of, pick_deliveries

A, B = "https://a.example/hook", "https://b.example/hook"


@pytest.mark.parametrize("due, in_flight, limits, started", [
    # every host below its limit: all start, in order
    ([("e1", A), ("e2", B)], {}, DeliveryLimits(8, 2), ["e1", "e2"]),
    # a host at its limit is passed over; the next host's events still start
    ([("e1", A), ("e2", A), ("e3", A), ("e4", B)], {}, DeliveryLimits(8, 2), ["e1", "e2", "e4"]),
    # attempts already open count against the host
    ([("e3", A), ("e4", B)], {"e1": host_of(A), "e2": host_of(A)}, DeliveryLimits(8, 2), ["e4"]),
    # an event in flight is not started twice
    ([("e1", A), ("e2", B)], {"e1": host_of(A)}, DeliveryLimits(8, 2), ["e2"]),
    # no more than the free threads
    ([("e3", A), ("e4", B), ("e5", "http://c.example/")], {"e1": "x:1", "e2": "y:1"}, DeliveryLimits(3, 2),
     ["e3"]),
    ([("e1", A)], {"e0": "x:1"}, DeliveryLimits(1, 1), []),
])
def test_pick_deliveries(due, in_flight, limits, started):
    assert [event_id for event_id, _ in pick_deliveries(due, in_flight, limits)] == started


@pytest.mark.parametrize("url, host", [
    ("https://Hooks.Example.com/x?token=1", "hooks.example.com:443"),
    ("http://hooks.example.com/x", "hooks.example.com:80"),
    ("http://127.0.0.1:8080/x", "127.0.0.1:8080"),
    ("https://[::1]:9000/x", "::1:9000"),
])
def test_host_of_names_host_and_port(url, host):
    assert host_of(url) == host


def test_limits_from_env_and_refused_values():
    assert DeliveryLimits.from_env({"BARGE_WEBHOOK_THREADS": "4", "BARGE_WEBHOOK_PER_HOST": "1"}) == DeliveryLimits(4, 1)
    assert DeliveryLimits.from_env({}) == DeliveryLimits()
    with pytest.raises(ValueError, match="per_host"):
        DeliveryLimits(4, 0)
    with pytest.raises(ValueError, match="BARGE_WEBHOOK_THREADS"):
        DeliveryLimits.from_env({"BARGE_WEBHOOK_THREADS": "many"})
