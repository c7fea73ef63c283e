"""What planning found, as `barge status` shows it: the input's layout, and a transcribe
job's progress in audio seconds (its shards are planned by audio: storage.durations)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from jobs.status import ShardStatus
from jobs.throughput import format_duration
from storage.layout import Layout

if TYPE_CHECKING:
    from jobs.records import JobProgress, ShardRecord
    from jobs.store import Store


@dataclass(frozen=True)
class AudioProgress:
    seconds_done: float  # audio seconds of the committed shards
    seconds_total: float  # of every shard, as planned from the files' headers
    num_unknown: int  # files whose duration could not be read (each weighs a second)
    eta_s: float | None  # at the audio rate so far; None when finished or no shard is committed yet

    def describe(self) -> str:
        share = self.seconds_done / self.seconds_total if self.seconds_total else 1.0
        files = "file" if self.num_unknown == 1 else "files"
        unknown = f" ({self.num_unknown} {files} of unknown duration)" if self.num_unknown else ""
        eta = f"; ETA {format_duration(self.eta_s)}" if self.eta_s is not None else ""
        return (f"audio: {self.seconds_done:,.0f} s done of {self.seconds_total:,.0f} s ({share:.0%}){unknown}{eta}")


def planned_layout(shards: list[ShardRecord]) -> Layout | None:
    """The layout planning found (kept with the first shard, queueing.planning.input_summary);
    None before planning, or for a job planned before layouts were kept."""
    summary = _input_summary(shards)
    return Layout.from_dict(summary["layout"]) if "layout" in summary else None


def audio_progress(shards: list[ShardRecord], state: JobProgress) -> AudioProgress | None:
    """A transcribe job's progress in audio seconds (its shards' planned work); None for other jobs."""
    summary = _input_summary(shards)
    if "audio_seconds" not in summary:
        return None
    total = sum(shard.plan.get("work", 0) for shard in shards)
    done = sum(shard.plan.get("work", 0) for shard in shards if shard.status == ShardStatus.COMMITTED)
    running_s = state.throughput.running_s if state.throughput is not None else 0.0
    eta = None
    if not state.is_finished and done and running_s > 0:
        eta = (total - done) / (done / running_s)
    return AudioProgress(done, total, summary.get("num_unknown_durations", 0), eta)


def _input_summary(shards: list[ShardRecord]) -> dict:
    first = next((shard for shard in shards if shard.shard_index == 0), None)
    return (first.plan.get("input") or {}) if first is not None else {}
