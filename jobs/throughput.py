"""How fast a job is going: rates over the whole run and over the last minutes, an
ETA, and where its time went. Pure arithmetic over what the store sums up in SQL.

NOTE: rows and tokens count when their shard commits, so rates move in steps of one
shard. The recent window is therefore minutes, not seconds; a window shorter than a
shard's run time would swing between zero and a burst.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

RECENT_WINDOW_S = 300.0


@dataclass(frozen=True)
class JobTimes:
    """What `measure` needs, as the store reads it (epoch seconds)."""

    now: float
    created_at: float
    finished_at: float | None           # the job's; None while it runs
    first_started_at: float | None      # the earliest shard attempt's start; None: no shard ran yet
    rows_total: int
    rows_done: int                      # rows of committed shards, failed rows included
    num_tokens: int                     # tokens of committed shards
    recent_rows: int                    # rows of shards committed within the window before `end`
    recent_tokens: int
    worker_s: float = 0.0               # summed run time of finished shard attempts
    window_s: float = RECENT_WINDOW_S

    @property
    def end(self) -> float:
        return self.finished_at if self.finished_at is not None else self.now


@dataclass(frozen=True)
class Throughput:
    rows_per_s: float | None            # since the first shard started; None before
    tokens_per_s: float | None
    recent_rows_per_s: float | None     # over the last `window_s` (or the whole run, if shorter)
    recent_tokens_per_s: float | None
    window_s: float
    eta_s: float | None                 # None: finished, or no rate to go by yet
    queued_s: float                     # submitted -> first shard started (or until now)
    running_s: float                    # first shard started -> finished (or now); 0 before
    worker_s: float                     # shard run time summed over workers (> running_s when parallel)

    def to_dict(self) -> dict:
        return {name: (round(value, 3) if isinstance(value, float) else value)
                for name, value in asdict(self).items()}


def measure(times: JobTimes, *, is_finished: bool) -> Throughput:
    started = times.first_started_at
    queued_s = max(0.0, (started if started is not None else times.end) - times.created_at)
    running_s = max(0.0, times.end - started) if started is not None else 0.0
    window_s = min(times.window_s, running_s)
    rows_per_s = _rate(times.rows_done, running_s)
    recent_rows_per_s = _rate(times.recent_rows, window_s)
    return Throughput(
        rows_per_s=rows_per_s, tokens_per_s=_rate(times.num_tokens, running_s),
        recent_rows_per_s=recent_rows_per_s, recent_tokens_per_s=_rate(times.recent_tokens, window_s),
        window_s=times.window_s,
        eta_s=None if is_finished else eta(times.rows_total - times.rows_done, recent_rows_per_s or rows_per_s),
        queued_s=queued_s, running_s=running_s, worker_s=times.worker_s)


def eta(rows_left: int, rows_per_s: float | None) -> float | None:
    """Seconds until the remaining rows are done at `rows_per_s`; None without a rate."""
    if rows_left <= 0:
        return 0.0
    if not rows_per_s:
        return None
    return rows_left / rows_per_s


def format_duration(seconds: float | None) -> str:
    """1h02m, 3m07s, 12s; "?" for None."""
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def format_rate(per_s: float | None, unit: str) -> str:
    if per_s is None:
        return "-"
    return f"{per_s:,.1f} {unit}/s" if per_s < 100 else f"{per_s:,.0f} {unit}/s"


def _rate(amount: int, seconds: float) -> float | None:
    return amount / seconds if seconds > 0 else None
