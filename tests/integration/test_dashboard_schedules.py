"""The schedules page through the real app over a real store: each time is a date and a
time in the schedule's own zone, with the zone's abbreviation, never a bare clock time."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

from tests.integration.test_dashboard_store import _app, served  # noqa: F401
from tests.integration.test_store import postgres_url, store, store_url  # noqa: F401

TEMPLATE = {"mode": "embed", "model": "minilm", "input": "/in/{date}/", "output": "/out/{date}/"}


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_the_next_fire_time_shows_its_date_time_and_zone(served):
    # Given a nightly schedule in Paris added on Bastille Day (summer time) and a weekly one in UTC
    store = served["store"]
    store.add_schedule("nightly", "0 2 * * *", "Europe/Paris", TEMPLATE, "latest", None,
                       now=_epoch("2026-07-14T12:00:00+00:00"))
    store.add_schedule("weekly", "30 6 * * 1", "UTC", TEMPLATE, "latest", None,
                       now=_epoch("2026-12-02T12:00:00+00:00"))
    run = store.add_manual_run("nightly", now=_epoch("2026-01-05T09:15:00+00:00"))   # winter time
    store.finish_run(run, "submitted")

    # When the operator opens the page and its live fragment
    http = _app(served, operator=True)
    pages = [http.get("/dashboard/schedules"), http.get("/dashboard/schedules", params={"fragment": 1})]

    # Then each next fire is the date and time in the schedule's zone, machine-readable too
    for page in pages:
        assert page.status_code == 200, page.text
        assert ('next fire <time class="next-fire" datetime="2026-07-15T02:00:00+02:00">'
                '2026-07-15 02:00:00 CEST</time>') in page.text
        assert ('next fire <time class="next-fire" datetime="2026-12-07T06:30:00+00:00">'
                '2026-12-07 06:30:00 UTC</time>') in page.text
        # and a run's period too, in the zone's winter abbreviation
        assert '<time datetime="2026-01-05T10:15:00+01:00">2026-01-05 10:15:00 CET</time>' in page.text
        assert not re.search(r">\d\d:\d\d:\d\d<", page.text)      # no time without its date


def test_the_next_fire_time_is_the_stored_instant(served):
    """The text is the instant the store fires at, whatever the server's own zone."""
    store = served["store"]
    schedule = store.add_schedule("tokyo", "15 9 * * *", "Asia/Tokyo", TEMPLATE, "latest", None)
    page = _app(served, operator=True).get("/dashboard/schedules").text
    shown = re.search(r'<time class="next-fire" datetime="([^"]+)">([^<]+)</time>', page)
    assert datetime.fromisoformat(shown.group(1)).timestamp() == schedule.next_run_at
    local = datetime.fromtimestamp(schedule.next_run_at, timezone.utc).astimezone(ZoneInfo("Asia/Tokyo"))
    assert shown.group(2) == f"{local:%Y-%m-%d} 09:15:00 JST"
