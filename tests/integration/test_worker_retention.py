"""Workers' heartbeat rows pruned after BARGE_WORKER_RETENTION_S, on a real SQLite file and
PostgreSQL: given workers alive, silent and stopped, when the housekeeper tidies, then
only the rows whose last beat (or clean stop) is older than the retention are gone."""

from __future__ import annotations

import time
from types import SimpleNamespace

from jobs.settings import Settings
from jobs.worker_beats import WorkerBeat, WorkerBeats
from queueing.housekeeping import tidy
from queueing.runtime import WorkerOptions
from tests.integration.test_store import postgres_url, store, store_url  # noqa: F401

DAY_S = 86_400.0


def beat(beats: WorkerBeats, worker_id: str, last_beat_s_ago: float, *, stopped: bool = False) -> None:
    at = time.time() - last_beat_s_ago
    beats.beat(WorkerBeat(id=worker_id, models=["all-MiniLM-L6-v2"], started_at=at - DAY_S, heartbeat_at=at,
                          stopped_at=at if stopped else None))


def test_rows_silent_or_stopped_longer_than_the_retention_are_pruned(store):
    beats = WorkerBeats(store.engine)
    beat(beats, "alive:1", 3.0)
    beat(beats, "died:2", 8 * DAY_S)
    beat(beats, "stopped:3", 8 * DAY_S, stopped=True)
    beat(beats, "stopped-yesterday:4", DAY_S, stopped=True)
    beat(beats, "silent-6-days:5", 6 * DAY_S)
    assert sorted(beats.prune(7 * DAY_S)) == ["died:2", "stopped:3"]
    assert sorted(b.id for b in beats.list()) == ["alive:1", "silent-6-days:5", "stopped-yesterday:4"]
    assert beats.prune(7 * DAY_S) == []
    beat(beats, "died:2", 1.0)   # it was only hung: its next beat writes its row again
    assert "died:2" in {b.id for b in beats.list()}


def test_the_housekeepers_tidy_prunes_by_the_setting(store, tmp_path):
    settings = Settings.from_env({"BARGE_DATA_DIR": str(tmp_path), "BARGE_DATABASE_URL": store.url,
                                  "BARGE_WORKER_RETENTION_S": "3600"})
    beats = WorkerBeats(store.engine)
    beat(beats, "gone:1", 7200.0)
    beat(beats, "here:2", 60.0)
    tidy(SimpleNamespace(store=store, settings=settings, options=WorkerOptions()))
    assert [b.id for b in beats.list()] == ["here:2"]

