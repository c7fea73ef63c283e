import json
import re
from datetime import datetime

import pytest

from webhooks.events import EVENT_TYPES, WebhookEvent, job_event


def succeeded_event(**overrides):
    fields = dict(
        job_id="job_42",
        status="succeeded",
        rows_total=10,
        rows_succeeded=9,
        rows_failed=1,
        output="s3://out/run/",
        manifest_url="s3://out/run/_manifest.json",
        error=None,
        metadata={"team": "search"},
        timings={"queued_s": 1.5, "run_s": 30.0},
    )
    fields.update(overrides)
    return job_event("job.succeeded", **fields)


def test_event_types():
    assert EVENT_TYPES == ("job.succeeded", "job.failed", "job.cancelled", "job.expired",
                           "job.progress", "shard.completed", "job.stalled")


def test_job_event_fields():
    event = succeeded_event()
    assert re.fullmatch(r"msg_[0-9a-f]{32}", event.event_id)
    assert event.type == "job.succeeded"
    assert event.job_id == "job_42"
    created = datetime.fromisoformat(event.created_at.replace("Z", "+00:00"))
    assert created.utcoffset().total_seconds() == 0
    assert event.data["rows"] == {"total": 10, "succeeded": 9, "failed": 1}


def test_each_event_gets_its_own_id():
    assert succeeded_event().event_id != succeeded_event().event_id


def test_body_is_compact_sorted_json_with_the_envelope():
    event = succeeded_event()
    body = event.body()
    payload = json.loads(body)
    assert set(payload) == {"id", "type", "timestamp", "version", "data"}
    assert payload["id"] == event.event_id
    assert payload["type"] == "job.succeeded"
    assert payload["timestamp"] == event.created_at
    assert payload["version"] == 1
    assert payload["data"] == {
        "job_id": "job_42",
        "status": "succeeded",
        "rows": {"total": 10, "succeeded": 9, "failed": 1},
        "output": "s3://out/run/",
        "manifest_url": "s3://out/run/_manifest.json",
        "error": None,
        "metadata": {"team": "search"},
        "timings": {"queued_s": 1.5, "run_s": 30.0},
    }
    assert body == json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()


def test_body_is_deterministic_regardless_of_dict_order():
    first = WebhookEvent("msg_1", "job.failed", "job_1", "2026-12-01T00:00:00Z", {"b": 1, "a": {"d": 2, "c": 3}})
    second = WebhookEvent("msg_1", "job.failed", "job_1", "2026-12-01T00:00:00Z", {"a": {"c": 3, "d": 2}, "b": 1})
    assert first.body() == second.body()
    assert first.body() == (
        b'{"data":{"a":{"c":3,"d":2},"b":1},"id":"msg_1",'
        b'"timestamp":"2026-12-01T00:00:00Z","type":"job.failed","version":1}'
    )


def test_missing_metadata_and_timings_become_empty_objects():
    event = succeeded_event(metadata=None, timings=None)
    assert event.data["metadata"] == {} and event.data["timings"] == {}


def test_job_event_copies_metadata():
    metadata = {"team": "search"}
    event = succeeded_event(metadata=metadata)
    metadata["team"] = "changed"
    assert event.data["metadata"] == {"team": "search"}


@pytest.mark.parametrize("bad_type", ["job.done", "", "JOB.SUCCEEDED"])
def test_unknown_type_is_refused(bad_type):
    with pytest.raises(ValueError, match="type"):
        job_event(
            bad_type, job_id="j", status="x", rows_total=0, rows_succeeded=0, rows_failed=0,
            output=None, manifest_url=None, error=None, metadata=None, timings=None,
        )
    with pytest.raises(ValueError, match="type"):
        WebhookEvent("msg_1", bad_type, "j", "2026-12-01T00:00:00Z", {})


def test_event_is_frozen():
    event = succeeded_event()
    with pytest.raises(AttributeError):
        event.type = "job.failed"


def test_job_event_refuses_opt_in_types():
    with pytest.raises(ValueError, match="type"):
        job_event("shard.completed", job_id="j", status="running", rows_total=1, rows_succeeded=1, rows_failed=0,
                  output=None, manifest_url=None, error=None, metadata=None, timings=None)


def test_shard_and_progress_events_are_small_and_versioned():
    from webhooks.events import progress_event, shard_event

    shard = shard_event(job_id="j", shard_index=3, rows_succeeded=9, rows_failed=1, part="part-00000-00003.parquet",
                        metadata={"run": 1})
    progress = progress_event(job_id="j", rows_total=100, rows_succeeded=40, rows_failed=2, shards_total=10,
                              shards_finished=4, metadata=None)
    assert shard.payload()["version"] == progress.payload()["version"] == 1
    assert shard.data == {"job_id": "j", "shard_index": 3, "rows": {"total": 10, "succeeded": 9, "failed": 1},
                          "part": "part-00000-00003.parquet", "metadata": {"run": 1}}
    assert progress.type == "job.progress"
    assert progress.data["shards"] == {"total": 10, "finished": 4} and progress.data["status"] == "running"
    assert len(shard.body()) < 400 and len(progress.body()) < 400
