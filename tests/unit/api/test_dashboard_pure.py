"""The dashboard's pure pieces: per-bucket rates from shard commits, the chart's
geometry, what redaction leaves of specs and URLs, and the heartbeat's step tally."""

from __future__ import annotations

import pytest

from api.dashboard.chart import MINUTE_S, SHORT_RUN_S, Commit, bucket_seconds, line_chart, per_bucket
from storage.redaction import redact_text, redact_url, redact_value
from engine.step_stats import StepStats
from queueing.heartbeat import StepTally


def test_no_commit_no_point():
    assert per_bucket([]) == ([], MINUTE_S)


@pytest.mark.parametrize("span_s, size", [(0, 1.0), (39, 1.0), (40, 2.0), (150, 5.0), (390, 10.0), (1000, 30.0),
                                           (SHORT_RUN_S, MINUTE_S), (86_400, MINUTE_S)])
def test_shorter_runs_get_smaller_buckets_up_to_a_minute(span_s, size):
    assert bucket_seconds(1000.0, 1000.0 + span_s) == size


def test_rates_per_bucket_with_empty_ones_as_zero():
    commits = [Commit(1000.0, 20, 200), Commit(1005.0, 10, 100), Commit(1231.0, 30, 600)]
    points, size = per_bucket(commits)
    assert size == 10.0
    assert [p.t for p in points] == [1000.0 + 10 * i for i in range(24)]
    assert [p.rows_per_s for p in points] == [3.0] + [0.0] * 22 + [3.0]
    assert [p.tokens_per_s for p in points] == [30.0] + [0.0] * 22 + [60.0]


def test_a_long_run_gets_minutes():
    commits = [Commit(0.0, 60, 600), Commit(SHORT_RUN_S + 30, 120, 0)]
    points, size = per_bucket(commits)
    assert size == MINUTE_S and len(points) == SHORT_RUN_S / MINUTE_S + 1
    assert points[0].rows_per_s == 1.0 and points[-1].rows_per_s == 2.0 and points[-1].tokens_per_s == 0.0


def test_chart_spans_its_box_and_puts_the_peak_on_top():
    chart = line_chart("rows/s", [0.0, 10.0, 20.0], [1.0, 4.0, 2.0], "rows", clock=str)
    xs = [x for x, _ in chart.points]
    ys = [y for _, y in chart.points]
    assert xs[0] == chart.margin and xs[-1] == chart.width - chart.margin
    assert ys[1] == chart.margin and ys[0] > ys[2] > ys[1]   # y grows downwards
    assert chart.peak == 4.0 and chart.labels[1] == "10.0 · 4.0 rows/s"


def test_one_point_sits_in_the_middle_and_zeros_do_not_divide_by_zero():
    chart = line_chart("tokens/s", [5.0], [0.0], "tokens", clock=str)
    assert chart.points == [(chart.width / 2, chart.height - chart.margin)]


@pytest.mark.parametrize("url, shown", [
    ("https://hooks.slack.com/services/T000/B000/XXXX", "https://hooks.slack.com/***"),
    ("https://user:pw@example.com:8443/hook?token=abc", "https://***@example.com:8443/***"),
    ("http://127.0.0.1:9000/", "http://127.0.0.1:9000/"),
])
def test_webhook_urls_lose_their_path_and_credentials(url, shown):
    assert redact_url(url) == shown


def test_a_spec_keeps_no_credential_token_or_secret():
    spec = {"input": ["s3://AKIAEXAMPLE:wJalrSECRET@corpus/a.parquet", "/data/b.parquet"],
            "output": "https://store.example.com/out?X-Amz-Signature=deadbeef",
            "webhook_url": "https://hooks.example.com/T1/B2/tok123",
            "metadata": {"api_key": "sk-live-1", "auth_token": "t0k-9", "team": "search", "nested": {"password": "hunter2", "n": 3},
                         "webhook_secret": "whsec_abc"},
            "params": {"max_tokens": 8}}
    shown = redact_value(spec)
    text = repr(shown)
    for secret in ("wJalrSECRET", "AKIAEXAMPLE", "deadbeef", "tok123", "sk-live-1", "t0k-9", "hunter2", "whsec_abc"):
        assert secret not in text
    assert shown["input"][1] == "/data/b.parquet" and shown["params"] == {"max_tokens": 8}
    assert shown["metadata"]["team"] == "search" and shown["metadata"]["nested"]["n"] == 3


def _step(num_seqs: int, used: int | None = None) -> StepStats:
    return StepStats(num_seqs=num_seqs, num_tokens=num_seqs, max_num_seqs=8, max_num_tokens=64,
                     num_kv_blocks_used=used, num_kv_blocks=None if used is None else 10)


def test_step_tally_averages_occupancy_per_beat_and_keeps_the_last_kv_use():
    tally = StepTally()
    for stats in (_step(2, 1), _step(6, 4)):
        tally(stats)
    first = tally.take({"model": "m"})
    assert first.num_steps == 2 and first.occupancy == 0.5 and first.kv_cache_usage == 0.4 and first.num_seqs == 6
    second = tally.take({"model": "m"})
    assert second.occupancy is None and second.num_steps == 2 and second.kv_cache_usage == 0.4


def test_a_delivery_error_shows_its_urls_as_webhook_urls():
    text = "HTTP 500 from https://hooks.example.com/T1/B2/XXXX?sig=1 after 0.2s"
    assert redact_text(text) == "HTTP 500 from https://hooks.example.com/*** after 0.2s"
    assert redact_text(None) is None
