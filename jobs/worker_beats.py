"""Workers' heartbeats: what each `barge worker` reports about itself every few seconds
(its models, each loaded engine's settings and last step figures), for the dashboard.

A report, not a lease: shards are held by their own leases (jobs.shard_store), and
nothing decides anything from this table. A worker that died simply stops beating; the
dashboard shows how long ago its last beat was. Every process ever started has a row (its
id holds the pid), so the housekeeper prunes those silent for BARGE_WORKER_RETENTION_S.
Migration 0014 creates the table.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from sqlalchemy import Column, Engine, Float, String, Table, Text, delete, or_, select, update

from jobs.tables import metadata

workers = Table(
    "barge_workers", metadata,
    Column("id", String(200), primary_key=True),          # Runtime.worker_id: "host:pid", as on shards
    Column("models", Text, nullable=False),                # JSON list of model keys it serves
    Column("engines", Text, nullable=False),               # JSON list of EngineBeat dicts
    Column("started_at", Float, nullable=False),
    Column("heartbeat_at", Float, nullable=False),
    Column("stopped_at", Float),                           # set by a worker that stopped cleanly
)


@dataclass(frozen=True)
class EngineBeat:
    """One loaded engine, as of the last beat."""

    settings: dict                          # queueing.usage.engine_settings: model, mode, device, dtype, limits
    num_steps: int = 0                      # steps since the worker started
    occupancy: float | None = None          # mean StepStats.occupancy over the steps since the last beat
    kv_cache_usage: float | None = None     # at the last step; None: no KV cache (embed) or no step yet
    num_seqs: int | None = None             # in the last step's batch
    device: dict | None = None              # its process's device figures (queueing.device_telemetry.DeviceFigures)
    stall: str | None = None                # the process exited because this engine stalled: why (queueing.stall)


@dataclass(frozen=True)
class WorkerBeat:
    id: str
    models: list[str]
    engines: list[EngineBeat] = field(default_factory=list)
    started_at: float = 0.0
    heartbeat_at: float = 0.0
    stopped_at: float | None = None


class WorkerBeats:
    def __init__(self, engine: Engine):
        self.engine = engine

    def beat(self, beat: WorkerBeat) -> None:
        """Insert or refresh the worker's row (a plain update, else an insert: portable)."""
        values = dict(models=json.dumps(beat.models), engines=json.dumps([e.__dict__ for e in beat.engines]),
                      heartbeat_at=beat.heartbeat_at, stopped_at=beat.stopped_at)
        with self.engine.begin() as conn:
            if conn.execute(update(workers).where(workers.c.id == beat.id).values(**values)).rowcount == 0:
                conn.execute(workers.insert().values(id=beat.id, started_at=beat.started_at, **values))

    def list(self, since: float | None = None) -> list[WorkerBeat]:
        """Workers whose last beat is after `since` (all when None), the latest first."""
        query = select(workers).order_by(workers.c.heartbeat_at.desc())
        if since is not None:
            query = query.where(workers.c.heartbeat_at >= since)
        with self.engine.connect() as conn:
            return [_beat(row) for row in conn.execute(query)]

    def prune(self, retention_s: float, now: float | None = None) -> list[str]:
        """Delete the rows of workers whose last beat, or clean stop, is over `retention_s`
        old; their ids. A worker that was only hung writes its row again at its next beat."""
        cutoff = (time.time() if now is None else now) - retention_s
        gone = or_(workers.c.heartbeat_at < cutoff, workers.c.stopped_at < cutoff)
        with self.engine.begin() as conn:
            return list(conn.execute(delete(workers).where(gone).returning(workers.c.id)).scalars())


def num_stalled(engine: Engine) -> int:
    """Workers whose last beat says an engine stalled (kept until their rows are pruned)."""
    with engine.connect() as conn:
        return len(conn.execute(select(workers.c.id).where(workers.c.engines.like('%"stall": "%'))).all())


def _beat(row) -> WorkerBeat:
    return WorkerBeat(id=row.id, models=json.loads(row.models),
                      engines=[EngineBeat(**e) for e in json.loads(row.engines)], started_at=row.started_at,
                      heartbeat_at=row.heartbeat_at, stopped_at=row.stopped_at)
