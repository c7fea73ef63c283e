"""Batches of the OpenAI-compatible API: what OpenAI's Batch object holds that a job
does not (owner, endpoint, input file, output and error files), and the id of the job
that does the work. Status, progress and times come from the job (api.batch_view).

Every lookup is by (owner, id), as for files (jobs.api_files).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field

from sqlalchemy import Engine, delete, insert, select, update

from jobs.api_tables import api_batches, newest_first_page

BATCH_ID = re.compile(r"^batch_[0-9a-f]{32}$")


@dataclass(frozen=True)
class BatchRecord:
    id: str
    key_id: str                          # the owner
    job_id: str | None                   # None: refused at validation (`errors` says why); recorded
                                         # before its job is made, so a job always has its batch
    endpoint: str
    model: str | None
    input_file_id: str
    completion_window: str
    metadata: dict = field(default_factory=dict)
    errors: list[dict] | None = None     # OpenAI BatchError objects: {code, message, param, line}
    num_requests: int = 0
    num_completed: int | None = None     # set when settled
    num_failed: int | None = None
    usage: dict | None = None            # {"input_tokens", "output_tokens"} of the output file's requests, when settled
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: float = 0.0
    cancelling_at: float | None = None
    settled_at: float | None = None      # output and error files written


def is_batch_id(value: str) -> bool:
    return bool(BATCH_ID.match(value))


def new_batch_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


class ApiBatches:
    def __init__(self, engine: Engine):
        self.engine = engine

    def create(self, batch: BatchRecord) -> BatchRecord:
        with self.engine.begin() as conn:
            conn.execute(insert(api_batches).values(
                id=batch.id, key_id=batch.key_id, job_id=batch.job_id, endpoint=batch.endpoint, model=batch.model,
                input_file_id=batch.input_file_id, completion_window=batch.completion_window,
                metadata=json.dumps(batch.metadata), errors=None if batch.errors is None else json.dumps(batch.errors),
                num_requests=batch.num_requests, created_at=batch.created_at, settled_at=batch.settled_at))
        return batch

    def discard(self, batch_id: str) -> None:
        """Remove a batch whose job was refused at submit (the caller answers the refusal)."""
        with self.engine.begin() as conn:
            conn.execute(delete(api_batches).where(api_batches.c.id == batch_id))

    def get(self, key_id: str, batch_id: str) -> BatchRecord | None:
        if not is_batch_id(batch_id):
            return None
        with self.engine.connect() as conn:
            row = conn.execute(select(api_batches).where(api_batches.c.id == batch_id,
                                                         api_batches.c.key_id == key_id)).one_or_none()
        return None if row is None else _record(row)

    def list(self, key_id: str, *, after: str | None, limit: int) -> tuple[list[BatchRecord], bool]:
        """The owner's batches, newest first, after the batch `after` (a cursor: OpenAI's
        pagination); and whether more follow."""
        query = select(api_batches).where(api_batches.c.key_id == key_id)
        cursor = None
        if after is not None:
            cursor = self.get(key_id, after)
            if cursor is None:
                return [], False
        return newest_first_page(self.engine, api_batches, query, cursor, limit, _record)

    def mark_cancelling(self, batch_id: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(update(api_batches).where(api_batches.c.id == batch_id, api_batches.c.cancelling_at.is_(None))
                         .values(cancelling_at=time.time()))

    def settle(self, batch_id: str, *, output_file_id: str | None, error_file_id: str | None, num_completed: int,
               num_failed: int, usage: dict | None = None, errors: list[dict] | None = None) -> bool:
        """Record the batch's output files once; False if another process settled it first
        (its files are the batch's, the caller's are to be deleted)."""
        values = dict(output_file_id=output_file_id, error_file_id=error_file_id, num_completed=num_completed,
                      num_failed=num_failed, settled_at=time.time())
        if errors is not None:
            values["errors"] = json.dumps(errors)
        if usage is not None:
            values["usage"] = json.dumps(usage)
        with self.engine.begin() as conn:
            result = conn.execute(update(api_batches).where(api_batches.c.id == batch_id,
                                                            api_batches.c.settled_at.is_(None)).values(**values))
        return result.rowcount == 1


def _record(row) -> BatchRecord:
    return BatchRecord(
        id=row.id, key_id=row.key_id, job_id=row.job_id, endpoint=row.endpoint, model=row.model,
        input_file_id=row.input_file_id, completion_window=row.completion_window, metadata=json.loads(row.metadata),
        errors=None if row.errors is None else json.loads(row.errors), num_requests=row.num_requests,
        num_completed=row.num_completed, num_failed=row.num_failed,
        usage=None if row.usage is None else json.loads(row.usage), output_file_id=row.output_file_id,
        error_file_id=row.error_file_id, created_at=row.created_at, cancelling_at=row.cancelling_at,
        settled_at=row.settled_at)


def owes_partial_manifest(engine: Engine, job_id: str) -> bool:
    """True while an unfinished job's partial manifest is still to be written (jobs.store):
    its output cannot be read as final yet."""
    from jobs.tables import jobs
    with engine.connect() as conn:
        sent_at = conn.execute(select(jobs.c.partial_output_sent_at).where(jobs.c.id == job_id)).scalar_one_or_none()
    return sent_at is not None
