"""A generate job's prefill and per-adapter usage (jobs.generate_usage): shards' usage summed
into the job's, stored as JSON and read back, and shown by `barge report` (jobs.report)."""

from __future__ import annotations

import json

import pytest

from jobs.generate_usage import AdapterUsage, GenerateUsage, Prefill, sum_usage
from jobs.report import JobReport, format_report
from jobs.throughput import JobTimes, measure

SQL, CHAT = "s3://adapters/sql/", "s3://AKIA:secret@adapters/chat/?versionId=3"


def shard(prompt: int, cached: int, bound: int | None, *adapters: AdapterUsage) -> GenerateUsage:
    return GenerateUsage(Prefill(prompt, cached, bound), adapters)


def test_shards_sum_their_prefill_and_merge_their_adapters_base_first():
    # Given two shards, one of them without base rows
    first = shard(1000, 400, 500, AdapterUsage(None, 4, 300), AdapterUsage(SQL, 6, 900))
    second = shard(2000, 100, 1500, AdapterUsage(SQL, 10, 2000))
    # When they are summed
    job = sum_usage([second, first])
    # Then
    assert job.prefill == Prefill(3000, 500, 2000) and job.prefill.num_computed_tokens == 2500
    assert job.adapters == (AdapterUsage(None, 4, 300), AdapterUsage(SQL, 16, 2900))


@pytest.mark.parametrize("bounds, expected", [((500, 700), 1200), ((500, None), None), ((None, None), None)])
def test_the_lower_bound_is_summed_only_when_every_shard_measured_it(bounds, expected):
    assert sum_usage(shard(10, 0, bound) for bound in bounds).prefill.num_lower_bound == expected


def test_no_shard_that_recorded_usage_sums_to_none():
    assert sum_usage([]) is None


def test_a_shards_usage_survives_its_json_round_trip():
    usage = shard(1000, 400, None, AdapterUsage(None, 4, 300), AdapterUsage(CHAT, 6, 900))
    assert GenerateUsage.from_dict(json.loads(json.dumps(usage.to_dict()))) == usage


def test_the_report_adds_computed_tokens_and_redacts_adapter_locations():
    usage = shard(1000, 400, 500, AdapterUsage(None, 4, 300), AdapterUsage(CHAT, 6, 900))
    shown = usage.to_report()
    assert shown["prefill"] == {"num_prompt_tokens": 1000, "num_cached_tokens": 400, "num_lower_bound": 500,
                                "num_computed_tokens": 600}
    assert shown["adapters"] == [{"adapter": None, "num_rows": 4, "num_tokens": 300},
                                 {"adapter": "s3://***@adapters/chat/?***", "num_rows": 6, "num_tokens": 900}]
    assert "adapters" not in shard(10, 0, 10).to_report(), "a job without adapters shows none"


def report(generate: GenerateUsage | None, mode: str = "generate") -> JobReport:
    times = JobTimes(now=100.0, created_at=0.0, finished_at=100.0, first_started_at=10.0, rows_total=20,
                     rows_done=20, num_tokens=5000, recent_rows=20, recent_tokens=5000)
    return JobReport(job_id="j", status="succeeded", mode=mode, model="smollm2", rows_total=20, rows_succeeded=20,
                     rows_failed=0, rows_reused=0, num_tokens=5000, num_shards=2, engines=[],
                     throughput=measure(times, is_finished=True), worker_s_by_device={"cpu": 90.0}, cost=None,
                     generate=generate)


def test_barge_report_shows_prefill_and_rows_and_tokens_per_adapter():
    usage = shard(18_134, 6_789, 10_300, AdapterUsage(None, 10, 1_234), AdapterUsage(SQL, 10, 23_456))
    text = format_report(report(usage))
    assert ("  prefill: 11,345 prompt tokens computed, 6,789 from the prefix cache, lower bound 10,300 (1.10x)"
            in text.splitlines())
    assert "  adapters: base 10 rows 1,234 tokens; s3://adapters/sql/ 10 rows 23,456 tokens" in text.splitlines()
    assert report(usage).to_dict()["prefill"]["num_computed_tokens"] == 11_345


def test_an_unmeasured_bound_says_so_and_a_job_without_adapters_has_no_adapter_line():
    text = format_report(report(shard(100, 0, None)))
    assert "  prefill: 100 prompt tokens computed, 0 from the prefix cache, lower bound not measured" in text
    assert "adapters:" not in text


def test_other_modes_and_shards_from_before_the_usage_column_report_as_before():
    plain = report(None, mode="embed")
    assert "prefill" not in format_report(plain) and "prefill" not in plain.to_dict()
    assert "adapters" not in plain.to_dict()
