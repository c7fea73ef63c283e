"""Rates, ETA and queued-vs-running time from what the store sums up (jobs.throughput)."""

from __future__ import annotations

import pytest

from jobs.throughput import JobTimes, eta, format_duration, measure


def times(**changes) -> JobTimes:
    fields = dict(now=1000.0, created_at=0.0, finished_at=None, first_started_at=100.0, rows_total=10_000,
                  rows_done=4500, num_tokens=90_000, recent_rows=3000, recent_tokens=60_000, window_s=300.0)
    return JobTimes(**{**fields, **changes})


def test_a_running_job_has_overall_and_recent_rates_and_an_eta_from_the_recent_one():
    t = measure(times(), is_finished=False)
    assert t.queued_s == 100.0 and t.running_s == 900.0
    assert t.rows_per_s == pytest.approx(4500 / 900) and t.tokens_per_s == pytest.approx(100.0)
    assert t.recent_rows_per_s == pytest.approx(10.0) and t.recent_tokens_per_s == pytest.approx(200.0)
    assert t.eta_s == pytest.approx(5500 / 10.0)


def test_the_window_shrinks_to_the_run_so_far():
    t = measure(times(now=160.0, rows_done=600, recent_rows=600), is_finished=False)
    assert t.running_s == 60.0
    assert t.recent_rows_per_s == pytest.approx(10.0), "600 rows over 60 s, not over a 300 s window"


def test_a_job_no_shard_started_yet_is_all_queued_and_has_no_rate():
    t = measure(times(first_started_at=None, rows_done=0, num_tokens=0, recent_rows=0, recent_tokens=0),
                is_finished=False)
    assert (t.queued_s, t.running_s) == (1000.0, 0.0)
    assert t.rows_per_s is None and t.recent_rows_per_s is None and t.eta_s is None


def test_a_quiet_window_falls_back_to_the_overall_rate_for_the_eta():
    t = measure(times(recent_rows=0, recent_tokens=0), is_finished=False)
    assert t.recent_rows_per_s == 0.0
    assert t.eta_s == pytest.approx(5500 / (4500 / 900))


def test_a_finished_job_is_measured_up_to_its_finish_and_has_no_eta():
    t = measure(times(finished_at=400.0, rows_done=10_000, now=99_999.0), is_finished=True)
    assert t.running_s == 300.0 and t.rows_per_s == pytest.approx(10_000 / 300)
    assert t.eta_s is None


@pytest.mark.parametrize("rows_left, rate, expected", [(0, None, 0.0), (100, None, None), (100, 0.0, None),
                                                       (100, 4.0, 25.0)])
def test_eta(rows_left, rate, expected):
    assert eta(rows_left, rate) == expected


@pytest.mark.parametrize("seconds, text", [(None, "?"), (12.4, "12s"), (187, "3m07s"), (3725, "1h02m")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text
