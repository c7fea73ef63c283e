"""The SQL store: jobs, shards and the webhook outbox, on SQLite or PostgreSQL.

Every state change goes through `jobs.status.check_transition` inside one transaction
that first locks the job row, so concurrent workers committing shards of one job are
serialised and exactly one of them sees the job become ready to finalize. On SQLite
the lock is the database write lock (`BEGIN IMMEDIATE`).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, create_engine, event, func, select, text, update, insert
from sqlalchemy.engine import make_url

from jobs import tables
from jobs.outbox import Outbox, OutboxEvent, insert_event, release_held
from jobs.private_files import make_private_sqlite
from jobs.cache_store import CacheStore
from jobs.schedule_store import ScheduleStore
from jobs.secret_box import SecretBox
from jobs.secret_store import SecretStore
from jobs.shard_store import ShardClaim, ShardCommitted, ShardEvents, ShardStore  # noqa: F401 (re-exported)
from jobs.records import JobProgress, JobRecord
from jobs.recovery_store import RecoveryStore
from jobs.spec import JobSpec
from jobs.status import JobStatus, ShardStatus, check_transition
from jobs.throughput import RECENT_WINDOW_S, JobTimes, measure

MIGRATIONS = Path(__file__).parent / "migrations"
# How long after a job ends unfinished a housekeeper still re-sends the write of its
# partial manifest (an output location that stays broken is not chased for ever).
PARTIAL_OUTPUT_CHASE_S = 86_400.0
# How long an unfinished job's final webhook waits for its partial manifest, so that a
# receiver reading the partial results finds them listed. Written, the manifest releases
# the event at once; a manifest that cannot be written holds it no longer than this.
PARTIAL_OUTPUT_HOLD_S = 60.0
# How long a SQLite connection waits for another process's write lock.
SQLITE_BUSY_TIMEOUT_S = 60.0


class Store(SecretStore, ShardStore, CacheStore, ScheduleStore, RecoveryStore):
    def __init__(self, url: str, secrets: SecretBox | None = None):
        """`secrets`: the key(s) webhook secrets are stored under; by default from
        BARGE_SECRET_KEY (jobs.secret_box), and SecretKeyError if there is none to be had."""
        self.url = url
        self.secrets = SecretBox.for_store(url) if secrets is None else secrets
        self.is_sqlite = url.startswith("sqlite")
        if self.is_sqlite:
            _make_sqlite_file_private(url)
            self.engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})
            _make_sqlite_transactions_immediate(self.engine)
        else:
            self.engine = create_engine(url, pool_pre_ping=True)
        self.outbox = Outbox(self.engine)

    def migrate(self) -> None:
        """Bring the schema to the newest revision; safe to run from several processes."""
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with self.engine.begin() as conn:
            if not self.is_sqlite:
                conn.execute(text("SELECT pg_advisory_xact_lock(7262061)"))   # one migrator at a time
            config.attributes["connection"] = conn
            config.attributes["secret_box"] = self.secrets   # 0011 encrypts secrets stored in plain text
            command.upgrade(config, "head")

    @contextmanager
    def _job_transaction(self, job_id: str) -> Iterator[tuple[Connection, object]]:
        with self.engine.begin() as conn:
            row = conn.execute(select(tables.jobs).where(tables.jobs.c.id == job_id).with_for_update()).one_or_none()
            if row is None:
                raise KeyError(f"no job {job_id!r}")
            yield conn, row

    # -- jobs --------------------------------------------------------------------------

    def create_job(self, spec: JobSpec, *, model_key: str, rows_total: int, output_schema: str,
                   webhook_secret: str | None, job_id: str | None = None, cache_namespace: str | None = None) -> str:
        """Record a QUEUED job. A given `job_id` that exists already raises
        sqlalchemy's IntegrityError: a schedule's run creates its job exactly once."""
        job_id = job_id or uuid.uuid4().hex
        now = time.time()
        expires_at = now + spec.expires_after_s if spec.expires_after_s is not None else None
        with self.engine.begin() as conn:
            conn.execute(insert(tables.jobs).values(
                id=job_id, status=int(JobStatus.QUEUED), mode=spec.mode, model_key=model_key,
                spec=json.dumps(spec.to_dict()), webhook_secret=self.secrets.encrypt(webhook_secret), expires_at=expires_at,
                rows_total=rows_total, output_schema=output_schema, created_at=now, updated_at=now,
                cache_namespace=cache_namespace, task_sent_at=now))
        return job_id

    def get_job(self, job_id: str) -> JobRecord:
        with self.engine.connect() as conn:
            row = conn.execute(select(tables.jobs).where(tables.jobs.c.id == job_id)).one_or_none()
        if row is None:
            raise KeyError(f"no job {job_id!r}")
        return JobRecord.from_row(row)

    def list_jobs(self, limit: int = 50) -> list[JobRecord]:
        query = select(tables.jobs).order_by(tables.jobs.c.created_at.desc()).limit(limit)
        with self.engine.connect() as conn:
            return [JobRecord.from_row(row) for row in conn.execute(query)]

    def progress(self, job_id: str, *, window_s: float = RECENT_WINDOW_S) -> JobProgress:
        job = self.get_job(job_id)
        shard = tables.shards.c
        query = (select(shard.status, func.count(), func.sum(shard.rows_succeeded), func.sum(shard.rows_failed),
                        func.sum(shard.rows_reused))
                 .where(shard.job_id == job_id).group_by(shard.status))
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
            times = self._job_times(conn, job, window_s)
        counts = {str(ShardStatus(status)): count for status, count, *_ in rows}
        committed = [r for r in rows if r[0] == int(ShardStatus.COMMITTED)]
        succeeded = sum(r[2] or 0 for r in committed)
        failed = sum(r[3] or 0 for r in committed)
        reused = sum(r[4] or 0 for r in committed)
        return JobProgress(job_id=job.id, status=job.status, rows_total=job.rows_total,
                           rows_succeeded=succeeded, rows_failed=failed, rows_reused=int(reused),
                           shards=counts, error=job.error,
                           output=job.spec.output, created_at=job.created_at, started_at=job.started_at,
                           finished_at=job.finished_at, num_tokens=times.num_tokens,
                           throughput=measure(times, is_finished=job.status.is_finished))

    def _job_times(self, conn: Connection, job: JobRecord, window_s: float) -> JobTimes:
        """One aggregate over the job's shards: what `jobs.throughput.measure` needs."""
        shard = tables.shards.c
        now = time.time()
        since = (job.finished_at or now) - window_s
        is_committed = shard.status == int(ShardStatus.COMMITTED)
        is_recent = is_committed & (shard.finished_at >= since)
        rows = shard.rows_succeeded + shard.rows_failed
        first_started, rows_done, num_tokens, recent_rows, recent_tokens, worker_s = conn.execute(select(
            func.min(shard.started_at), func.sum(rows).filter(is_committed),
            func.sum(shard.num_tokens).filter(is_committed), func.sum(rows).filter(is_recent),
            func.sum(shard.num_tokens).filter(is_recent),
            func.sum(shard.finished_at - shard.started_at).filter(shard.finished_at.is_not(None)),
        ).where(shard.job_id == job.id)).one()
        # PostgreSQL sums integers as NUMERIC (Decimal): back to int.
        return JobTimes(now=now, created_at=job.created_at, finished_at=job.finished_at,
                        first_started_at=first_started, rows_total=job.rows_total, rows_done=int(rows_done or 0),
                        num_tokens=int(num_tokens or 0), recent_rows=int(recent_rows or 0),
                        recent_tokens=int(recent_tokens or 0), worker_s=float(worker_s or 0.0), window_s=window_s)

    def device_seconds(self, job_id: str) -> dict[str, float]:
        """Run time of the job's finished shard attempts summed by device type ("unknown":
        attempts that recorded none, e.g. dead-lettered ones). Only each shard's last
        attempt counts: earlier, lost attempts left no finish time."""
        shard = tables.shards.c
        query = (select(shard.device, func.sum(shard.finished_at - shard.started_at))
                 .where(shard.job_id == job_id, shard.finished_at.is_not(None), shard.started_at.is_not(None))
                 .group_by(shard.device))
        with self.engine.connect() as conn:
            return {device or "unknown": float(seconds or 0.0) for device, seconds in conn.execute(query).all()}

    def engine_settings(self, job_id: str) -> list[dict]:
        """The distinct engine settings its committed shards recorded (one per kind of worker)."""
        shard = tables.shards.c
        query = select(shard.engine).where(shard.job_id == job_id, shard.engine.is_not(None)).distinct()
        with self.engine.connect() as conn:
            return sorted((json.loads(text) for text in conn.execute(query).scalars()), key=json.dumps)

    def record_quant_check(self, job_id: str, check: dict) -> None:
        """The FP8 check's figures (or its error), replacing an earlier attempt's."""
        with self.engine.begin() as conn:
            conn.execute(update(tables.jobs).where(tables.jobs.c.id == job_id)
                         .values(quant_check=json.dumps(check)))

    def quant_check(self, job_id: str) -> dict | None:
        """What record_quant_check stored; None when the job ran no check (yet)."""
        with self.engine.connect() as conn:
            stored = conn.execute(select(tables.jobs.c.quant_check).where(tables.jobs.c.id == job_id)).scalar()
        return None if stored is None else json.loads(stored)

    def start_job(self, job_id: str, plans: list[dict]) -> bool:
        """QUEUED -> RUNNING with its shards; False if the job is no longer QUEUED."""
        now = time.time()
        with self._job_transaction(job_id) as (conn, job):
            if JobStatus(job.status) != JobStatus.QUEUED:
                return False
            self._set_job_status(conn, job, JobStatus.RUNNING, started_at=now)
            if plans:
                conn.execute(insert(tables.shards), [
                    dict(job_id=job_id, shard_index=plan["shard_index"], plan=json.dumps(plan),
                         num_rows=plan["num_rows"], status=int(ShardStatus.PENDING), attempt=0,
                         rows_succeeded=0, rows_failed=0, updated_at=now)
                    for plan in plans])
        return True

    def begin_finalize(self, job_id: str) -> bool:
        """RUNNING -> FINALIZING once every shard is finished, or a FINALIZING job whose
        finalize is run again (its worker died, or gave up on an outage: jobs.recovery_store);
        False otherwise. Either way the finalize's start is recorded (task_sent_at)."""
        now = time.time()
        with self._job_transaction(job_id) as (conn, job):
            status = JobStatus(job.status)
            if status == JobStatus.FINALIZING:
                conn.execute(update(tables.jobs).where(tables.jobs.c.id == job_id).values(task_sent_at=now))
                return True
            if status != JobStatus.RUNNING or self._num_unfinished(conn, job_id):
                return False
            self._set_job_status(conn, job, JobStatus.FINALIZING, task_sent_at=now)
        return True

    def finish_job(self, job_id: str, status: JobStatus, *, error: str | None = None,
                   event: OutboxEvent | None = None) -> bool:
        """Move the job to a final state and queue its webhook event, in one transaction.

        False (and nothing written) if the job is already finished."""
        now = time.time()
        with self._job_transaction(job_id) as (conn, job):
            if JobStatus(job.status).is_finished:
                return False
            # A planned job that ends unfinished owes the manifest of what it committed;
            # the caller sends the task that writes it (queueing.finalize.write_partial_output).
            owes_manifest = status != JobStatus.SUCCEEDED and self._num_shards(conn, job_id) > 0
            self._set_job_status(conn, job, status, error=error, finished_at=now,
                                 partial_output_sent_at=now if owes_manifest else None)
            if status in (JobStatus.CANCELLED, JobStatus.EXPIRED):
                shard = tables.shards.c
                conn.execute(update(tables.shards)
                             .where(shard.job_id == job_id, shard.status.in_([int(ShardStatus.PENDING), int(ShardStatus.RUNNING)]))
                             .values(status=int(ShardStatus.CANCELLED), token=None, updated_at=now))
            if event is not None:
                insert_event(conn, job_id, event, now, due_at=now + PARTIAL_OUTPUT_HOLD_S if owes_manifest else None)
        return True

    def retry_job(self, job_id: str) -> JobStatus:
        """Re-open a failed, cancelled or expired job: its failed and cancelled shards go
        back to PENDING with a fresh attempt budget, committed ones stay. Returns the
        job's new status: RUNNING (resume its shards) or QUEUED (plan it afresh)."""
        now = time.time()
        shard = tables.shards.c
        with self._job_transaction(job_id) as (conn, job):
            status = JobStatus(job.status)
            if status not in (JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.EXPIRED):
                raise ValueError(f"job {job_id} is {status}: only a failed, cancelled or expired job can be retried")
            target = JobStatus.RUNNING if self._num_shards(conn, job_id) else JobStatus.QUEUED
            spec = JobSpec.from_dict(json.loads(job.spec))
            self._set_job_status(conn, job, target, error=None, finished_at=None, partial_output_sent_at=None,
                                 staging_removed_at=None, stalled_notified_at=None,
                                 expires_at=now + spec.expires_after_s if spec.expires_after_s else None,
                                 task_sent_at=now)
            conn.execute(update(tables.shards).where(
                shard.job_id == job_id, shard.status.in_([int(ShardStatus.FAILED), int(ShardStatus.CANCELLED)]))
                .values(status=int(ShardStatus.PENDING), attempt=0, token=None, error=None, queued_at=None,
                        lease_expires_at=None, finished_at=None, updated_at=now))
        return target

    @staticmethod
    def _num_shards(conn: Connection, job_id: str) -> int:
        return conn.execute(select(func.count()).where(tables.shards.c.job_id == job_id)).scalar_one()

    def _set_job_status(self, conn: Connection, job, target: JobStatus, **values) -> None:
        check_transition(JobStatus(job.status), target)
        conn.execute(update(tables.jobs).where(tables.jobs.c.id == job.id)
                     .values(status=int(target), updated_at=time.time(), **values))

    # -- shards ------------------------------------------------------------------------

    # -- expiry ----------------------------------------------------------------------

    def expired_jobs(self, now: float | None = None) -> list[str]:
        """Jobs past their `expires_at` that are still QUEUED or RUNNING."""
        now = time.time() if now is None else now
        job = tables.jobs.c
        query = select(job.id).where(job.expires_at <= now,
                                     job.status.in_([int(JobStatus.QUEUED), int(JobStatus.RUNNING)]))
        with self.engine.connect() as conn:
            return list(conn.execute(query).scalars())

    # -- partial manifests --------------------------------------------------------------

    def stale_partial_outputs(self, older_than_s: float, now: float | None = None,
                              within_s: float = PARTIAL_OUTPUT_CHASE_S) -> list[str]:
        """Jobs that ended unfinished whose partial manifest is still owed though its task
        was sent `older_than_s` ago: the send or the write was lost (a process killed
        between the final state and the send, a broker or storage outage). Writing the
        manifest again is harmless. Jobs that ended more than `within_s` ago are left be."""
        now = time.time() if now is None else now
        job = tables.jobs.c
        # Set only as a job ends unfinished, cleared by a retry: no status to check.
        query = select(job.id).where(job.partial_output_sent_at < now - older_than_s,
                                     job.finished_at >= now - within_s)
        with self.engine.connect() as conn:
            return list(conn.execute(query).scalars())

    def touch_partial_output(self, job_id: str, now: float | None = None) -> None:
        """Its task was sent again now."""
        now = time.time() if now is None else now
        with self.engine.begin() as conn:
            conn.execute(update(tables.jobs).where(tables.jobs.c.id == job_id).values(partial_output_sent_at=now))

    def partial_output_written(self, job_id: str) -> list[str]:
        """Its partial manifest is written: nothing more is owed, and the final webhook
        held for it is due now. Returns the ids of the events released."""
        now = time.time()
        with self.engine.begin() as conn:
            conn.execute(update(tables.jobs).where(tables.jobs.c.id == job_id).values(partial_output_sent_at=None))
            return release_held(conn, job_id, now)


def _make_sqlite_file_private(url: str) -> None:
    """The database file 0600 (and so its -wal and -shm) in a 0700 folder, made before
    SQLite creates it with the umask's 0644 (jobs.private_files)."""
    database = make_url(url).database
    if database and database != ":memory:" and not database.startswith("file:"):
        make_private_sqlite(Path(os.path.expanduser(database)))


def _use_wal(cursor, timeout_s: float = SQLITE_BUSY_TIMEOUT_S) -> None:
    """Put the database in WAL mode, once for the file's lifetime (the mode is stored in it).

    Switching needs the file to itself, and SQLite answers "database is locked" at once,
    without waiting on the busy timeout, while another process holds it: two workers
    opening a fresh data folder together (one migrating, one switching) would lose one.
    So the switch is retried until the other lets go."""
    deadline = time.monotonic() + timeout_s
    delay_s = 0.01
    while True:
        try:
            if cursor.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
                return
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
        time.sleep(delay_s)
        delay_s = min(delay_s * 2, 0.5)


def _make_sqlite_transactions_immediate(engine) -> None:
    # pysqlite's own transaction handling starts with a deferred BEGIN; two processes
    # that both read and then write would then fail with "database is locked". Take the
    # write lock up front instead, and let readers run alongside in WAL mode.
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        _use_wal(cursor)
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE")
