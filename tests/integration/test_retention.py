"""Retention by command: `prune` removes a schedule's outputs and cache entries older
than its retention — only finished jobs' Barge files, only unused cache entries —
and a dry run removes nothing."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import update

from jobs import tables
from jobs.beat import Beat
from cli.main import main as barge
from jobs.client import Client
from jobs.settings import Settings
from jobs.status import JobStatus
from tests.integration.test_beat import FakeClock

DAY = 86_400.0
FIRST = datetime(2026, 12, 2, 2, tzinfo=timezone.utc).timestamp()
BARGE_FILES = ("_SUCCESS", "_manifest.json", "part-00000-00000.parquet")


@pytest.fixture
def client(tmp_path, monkeypatch):
    monkeypatch.setenv("BARGE_DATA_DIR", str(tmp_path / "barge"))
    client = Client(settings=Settings.from_env())
    yield client
    client.store.engine.dispose()


def five_nights(client, tmp_path) -> list:
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"text": ["a"]}), corpus)
    client.schedules.add("nightly", cron="0 2 * * *", catchup="all", retention_s=2 * DAY, template={
        "mode": "embed", "model": "minilm", "input": str(corpus), "incremental": True,
        "output": str(tmp_path / "out" / "{date:%Y-%m-%d}")})
    with client.store.engine.begin() as conn:
        conn.execute(update(tables.schedules).values(next_run_at=FIRST))
    Beat(client, FakeClock(FIRST + 4 * DAY + 60)).tick()
    runs = client.schedules.runs("nightly")
    for run in runs[:4]:   # the first four finished and wrote their output; the fifth still runs
        with client.store.engine.begin() as conn:
            conn.execute(update(tables.jobs).where(tables.jobs.c.id == run.job_id)
                         .values(status=int(JobStatus.SUCCEEDED)))
        output = client.job(run.job_id).status().output
        for name in BARGE_FILES + ("notes.txt",):
            (tmp_path / "out" / output.rsplit("/", 1)[-1]).mkdir(parents=True, exist_ok=True)
            (tmp_path / "out" / output.rsplit("/", 1)[-1] / name).write_text("x")
    return runs


def test_prune_removes_old_finished_outputs_and_unused_cache_entries(client, tmp_path, capsys):
    runs = five_nights(client, tmp_path)
    now = FIRST + 4 * DAY + 60
    namespace = client.store.get_job(runs[0].job_id).cache_namespace
    cache_dir = tmp_path / "barge" / "cache" / namespace
    cache_dir.mkdir(parents=True)
    (cache_dir / "old.parquet").write_text("x")
    (cache_dir / "fresh.parquet").write_text("x")
    client.store.cache_register(namespace, str(cache_dir / "old.parquet"), [("a" * 64, 0)], now=FIRST)
    client.store.cache_register(namespace, str(cache_dir / "fresh.parquet"), [("b" * 64, 0)], now=now - 60)

    dry = client.schedules.prune("nightly", dry_run=True, now=now)
    expected = [str(tmp_path / "out" / d) for d in ("2026-12-02", "2026-12-03", "2026-12-04")]
    assert (dry.outputs, dry.cache_entries, dry.cache_files) == (expected, 1, [str(cache_dir / "old.parquet")])
    assert all((tmp_path / "out" / "2026-12-02" / name).exists() for name in BARGE_FILES)   # nothing removed

    report = client.schedules.prune("nightly", now=now)
    assert report.outputs == expected and report.cache_entries == 1
    for day in ("02", "03", "04"):
        folder = tmp_path / "out" / f"2026-12-{day}"
        assert not any((folder / name).exists() for name in BARGE_FILES)
        assert (folder / "notes.txt").exists(), "files that are not Barge's stay"
    assert all((tmp_path / "out" / "2026-12-05" / name).exists() for name in BARGE_FILES)   # within retention
    assert not (cache_dir / "old.parquet").exists() and (cache_dir / "fresh.parquet").exists()
    assert set(client.store.cache_lookup(namespace, ["a" * 64, "b" * 64])) == {"b" * 64}
    assert [r.pruned_at is not None for r in client.schedules.runs("nightly")] == [True, True, True, False, False]

    again = client.schedules.prune("nightly", now=now)
    assert (again.outputs, again.cache_entries, again.cache_files) == ([], 0, [])


def test_a_schedule_without_retention_keeps_everything(client, tmp_path):
    five_nights(client, tmp_path)
    with client.store.engine.begin() as conn:
        conn.execute(update(tables.schedules).values(retention_s=None))
    report = client.schedules.prune(now=FIRST + 100 * DAY)
    assert (report.outputs, report.cache_entries) == ([], 0)


def test_schedule_commands(client, tmp_path, capsys):
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"text": ["a"]}), corpus)
    template = tmp_path / "job.json"
    template.write_text(json.dumps({"mode": "embed", "model": "minilm", "input": str(corpus)}))
    assert barge(["schedule", "add", "nightly", "--cron", "0 2 * * *", "--timezone", "Europe/Paris",
                  "--template", str(template), "--output", str(tmp_path / "out" / "{date:%Y-%m-%d}"),
                  "--incremental", "--retention-days", "7", "--param", "dimensions=128"]) == 0
    assert "schedule nightly added; next run " in capsys.readouterr().out
    schedule = client.schedules.get("nightly")
    assert schedule.template["incremental"] is True and schedule.template["params"] == {"dimensions": 128}
    assert barge(["schedule", "list"]) == 0
    listing = capsys.readouterr().out
    assert "nightly" in listing and "Europe/Paris" in listing and "7d" in listing and "enabled" in listing
    assert barge(["schedule", "pause", "nightly"]) == 0 and not client.schedules.get("nightly").is_enabled
    assert barge(["schedule", "resume", "nightly"]) == 0 and client.schedules.get("nightly").is_enabled
    assert barge(["schedule", "run-now", "nightly"]) == 0
    assert "queued" in capsys.readouterr().out
    assert barge(["schedule", "runs", "nightly"]) == 0
    assert "manual" in capsys.readouterr().out
    assert barge(["schedule", "prune", "--dry-run"]) == 0
    assert "would remove 0 outputs" in capsys.readouterr().out
    assert barge(["beat", "--once"]) == 0
    assert "0 runs planned" in capsys.readouterr().out
    assert barge(["schedule", "add", "bad", "--cron", "every night", "--template", str(template),
                  "--output", "x"]) == 2
    assert "schedule refused: cron:" in capsys.readouterr().err
    assert barge(["schedule", "add", "nightly", "--cron", "0 2 * * *", "--template", str(template),
                  "--output", "x"]) == 1
    assert "exists already" in capsys.readouterr().err
    assert barge(["schedule", "remove", "nightly"]) == 0
    assert barge(["schedule", "pause", "nightly"]) == 1
