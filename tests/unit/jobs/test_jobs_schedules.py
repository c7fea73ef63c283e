"""Schedules as pure decisions: due periods under each catch-up policy, time zones
across daylight-saving changes, templates rendered per period, refused schedules."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from jobs.schedules import ScheduleError, check_schedule, due_periods, next_fire_time, render_spec
from jobs.spec import JobSpecError

UTC = ZoneInfo("UTC")
PARIS = ZoneInfo("Europe/Paris")
TEMPLATE = {"mode": "embed", "model": "minilm", "input": "s3://corpus/{date:%Y-%m-%d}/*.parquet",
            "output": "s3://out/{date:%Y-%m-%d}/", "incremental": True}


def epoch(*args, tz=UTC) -> float:
    return datetime(*args, tzinfo=tz).timestamp()


DAILY_2AM = "0 2 * * *"
D1, D2, D3, D4 = (epoch(2026, 12, d, 2) for d in (1, 2, 3, 4))


@pytest.mark.parametrize("catchup, now, run, skipped", [
    # on time: each policy runs the period that is due
    ("skip", D1 + 10, [D1], []),
    ("latest", D1 + 10, [D1], []),
    ("all", D1 + 10, [D1], []),
    # three periods passed while nothing ran (now just after the third)
    ("skip", D3 + 10, [D3], [D1, D2]),
    ("latest", D3 + 10, [D3], [D1, D2]),
    ("all", D3 + 10, [D1, D2, D3], []),
    # ... and now long after the third: skip runs none of them, latest the last
    ("skip", D3 + 3600, [], [D1, D2, D3]),
    ("latest", D3 + 3600, [D3], [D1, D2]),
    ("all", D3 + 3600, [D1, D2, D3], []),
    # nothing due yet
    ("all", D1 - 1, [], []),
])
def test_due_periods_by_catchup_policy(catchup, now, run, skipped):
    due = due_periods(DAILY_2AM, "UTC", catchup, cursor=D1, now=now)
    assert (due.run, due.skipped) == (run, skipped)
    if run or skipped:
        assert due.next_run_at == next_fire_time(DAILY_2AM, "UTC", now) > now
    else:
        assert due.next_run_at == D1


def test_a_period_is_run_once_as_the_cursor_moves_past_it():
    cursor, fired = D1, []
    for now in (D1 - 5, D1, D1 + 1, D1 + 60, D2 - 1, D2 + 30, D3 + 1):
        due = due_periods(DAILY_2AM, "UTC", "all", cursor, now)
        fired += due.run
        cursor = due.next_run_at
    assert fired == [D1, D2, D3]


def paris_fires(cron: str, start: tuple, count: int) -> list[datetime]:
    fires, t = [], epoch(*start, tz=PARIS)
    for _ in range(count):
        t = next_fire_time(cron, "Europe/Paris", t)
        fires.append(datetime.fromtimestamp(t, PARIS))
    return fires


def test_cron_is_read_in_the_schedules_time_zone_when_clocks_go_back():
    # 02:30 happens twice on 2026-10-25 in Paris: it fires once, at the first
    fires = paris_fires("30 2 * * *", (2026, 10, 23, 12), 4)
    assert [(f.day, f.hour, f.minute) for f in fires] == [(24, 2, 30), (25, 2, 30), (26, 2, 30), (27, 2, 30)]
    assert [f.utcoffset().total_seconds() / 3600 for f in fires] == [2, 2, 1, 1]   # CEST, then CET: local time kept


def test_cron_is_read_in_the_schedules_time_zone_when_clocks_go_forward():
    # 02:30 does not exist on 2026-03-29 in Paris: that night's run is at 03:00, once
    fires = paris_fires("30 2 * * *", (2026, 3, 27, 12), 4)
    assert [(f.day, f.hour, f.minute) for f in fires] == [(28, 2, 30), (29, 3, 0), (30, 2, 30), (31, 2, 30)]


def test_template_renders_the_period_date_in_its_zone():
    # 00:30 Paris on 2 Dec is still 1 Dec in UTC: {date} is the schedule's local date
    period = epoch(2026, 12, 2, 0, 30, tz=PARIS)
    spec = render_spec(TEMPLATE | {"output": "out/{date:%Y-%m-%d}/{prev_date:%d}/"}, "30 0 * * *",
                       "Europe/Paris", period, "nightly")
    assert spec.input == "s3://corpus/2026-12-02/*.parquet"
    assert spec.output == "out/2026-12-02/01/"
    assert spec.incremental is True
    assert spec.metadata == {"schedule": "nightly", "period": "2026-12-02T00:30:00+01:00"}


def test_template_with_a_bad_placeholder_names_the_field():
    with pytest.raises(JobSpecError, match=r"output: bad placeholder .*\{day\}"):
        render_spec(TEMPLATE | {"output": "out/{day}/"}, DAILY_2AM, "UTC", D1, "x")


@pytest.mark.parametrize("change, field", [
    ({"cron": "0 2 * *"}, "cron"),
    ({"cron": "61 2 * * *"}, "cron"),
    ({"tz": "Mars/Olympus"}, "timezone"),
    ({"catchup": "sometimes"}, "catchup"),
    ({"retention_s": -1}, "retention_s"),
    ({"name": ""}, "name"),
    ({"template": TEMPLATE | {"mode": "paint"}}, "template.mode"),
    ({"template": TEMPLATE | {"colour": "red"}}, "template.colour"),
    ({"template": {k: v for k, v in TEMPLATE.items() if k != "output"}}, "template.output"),
])
def test_bad_schedules_are_refused_naming_the_field(change, field):
    args = {"name": "nightly", "cron": DAILY_2AM, "tz": "UTC", "catchup": "latest", "retention_s": 86400.0,
            "template": TEMPLATE} | change
    with pytest.raises(ScheduleError) as caught:
        check_schedule(args["name"], args["cron"], args["tz"], args["catchup"], args["retention_s"], args["template"])
    assert caught.value.field == field, str(caught.value)
