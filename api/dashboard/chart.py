"""Progress over time from shard commits: rows/s and tokens/s per time bucket, and the
SVG geometry of a small line chart. Pure arithmetic: tested with made-up commits.

NOTE: rows and tokens count when their shard commits (jobs.throughput says why), so a
bucket's rate is the rows of the shards committed in it over the bucket's length. A
minute is the bucket from SHORT_RUN_S of commits on; a shorter run gets the smallest of
BUCKET_CHOICES that keeps it to MAX_SHORT_BUCKETS points, so that a job of a few minutes
still draws a line rather than one or two dots.
"""

from __future__ import annotations

from dataclasses import dataclass

MINUTE_S = 60.0
SHORT_RUN_S = 20 * 60.0
BUCKET_CHOICES = (1.0, 2.0, 5.0, 10.0, 30.0)
MAX_SHORT_BUCKETS = 40
MAX_BUCKETS = 720   # a long run's chart is cut to its last 12 hours of minutes


@dataclass(frozen=True)
class Commit:
    finished_at: float    # when the shard committed
    num_rows: int         # its rows, failed ones included
    num_tokens: int


@dataclass(frozen=True)
class Point:
    t: float              # the bucket's start (epoch seconds)
    rows_per_s: float
    tokens_per_s: float


def bucket_seconds(first: float, last: float) -> float:
    span = last - first
    if span >= SHORT_RUN_S:
        return MINUTE_S
    return next((size for size in BUCKET_CHOICES if span / size < MAX_SHORT_BUCKETS), MINUTE_S)


def per_bucket(commits: list[Commit]) -> tuple[list[Point], float]:
    """One point per bucket from the first commit's to the last's, empty buckets as 0;
    and the bucket length."""
    if not commits:
        return [], MINUTE_S
    first = min(c.finished_at for c in commits)
    last = max(c.finished_at for c in commits)
    size = bucket_seconds(first, last)
    start = first - first % size
    count = int((last - start) // size) + 1
    skip = max(0, count - MAX_BUCKETS)
    rows, tokens = [0] * count, [0] * count
    for c in commits:
        i = int((c.finished_at - start) // size)
        rows[i] += c.num_rows
        tokens[i] += c.num_tokens
    return [Point(t=start + i * size, rows_per_s=rows[i] / size, tokens_per_s=tokens[i] / size)
            for i in range(skip, count)], size


@dataclass(frozen=True)
class Chart:
    """A line chart's geometry in a WIDTH x HEIGHT box, for the template's <svg>."""

    title: str
    peak: float                        # the y axis's top value
    points: list[tuple[float, float]]  # (x, y) in SVG units, y down
    labels: list[str]                  # one per point: "12:03 · 41.2 rows/s"
    width: int = 540
    height: int = 160
    margin: int = 8

    @property
    def polyline(self) -> str:
        return " ".join(f"{x:.1f},{y:.1f}" for x, y in self.points)


def line_chart(title: str, times: list[float], values: list[float], unit: str, clock) -> Chart:
    """`clock(t)` formats a time for the labels (the page's timezone is the server's)."""
    chart = Chart(title=title, peak=0.0, points=[], labels=[])
    if not values:
        return chart
    peak = max(values) or 1.0
    inner_w, inner_h = chart.width - 2 * chart.margin, chart.height - 2 * chart.margin
    step = inner_w / (len(values) - 1) if len(values) > 1 else 0.0
    points = [(chart.margin + (i * step if len(values) > 1 else inner_w / 2),
               chart.margin + inner_h * (1 - value / peak)) for i, value in enumerate(values)]
    labels = [f"{clock(t)} · {value:,.1f} {unit}/s" for t, value in zip(times, values)]
    return Chart(title=title, peak=peak, points=points, labels=labels)
