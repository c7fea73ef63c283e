"""The tables behind the OpenAI-compatible API (api/): keys, files, batches. Times are
UTC epoch seconds, as in jobs.tables; migrations 0012, 0015 and 0016 create exactly these.

A batch is a job: `barge_api_batches` holds only what OpenAI's Batch object has and a
job has not (its owner, endpoint, input file, output and error files), and names the
job that does the work."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import (BigInteger, Boolean, Column, Engine, Float, ForeignKey, Index, Integer, Select, String,
                        Table, Text, false)

from jobs.tables import metadata

api_keys = Table(
    "barge_api_keys", metadata,
    Column("id", String(40), primary_key=True),           # "key_..."; shown by `barge api-key list`
    Column("name", String(200), nullable=False),
    Column("secret_sha256", String(64), nullable=False, unique=True),   # hex SHA-256 of the bearer token
    Column("created_at", Float, nullable=False),
    Column("revoked_at", Float),
    Column("is_operator", Boolean, nullable=False, server_default=false()),   # sees every key's jobs (0015)
)

# A dashboard login (0015): the cookie holds a random id, only its SHA-256 is kept; a
# session ends at its expiry, at logout (revoked_at) or when its key is revoked.
dashboard_sessions = Table(
    "barge_dashboard_sessions", metadata,
    Column("id_sha256", String(64), primary_key=True),
    Column("key_id", String(40), ForeignKey("barge_api_keys.id")),   # NULL: the operator, by the login URL
    Column("is_operator", Boolean, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("revoked_at", Float),
    Index("ix_barge_dashboard_sessions_expiry", "expires_at"),
)

api_files = Table(
    "barge_api_files", metadata,
    Column("id", String(40), primary_key=True),           # "file-..."
    Column("key_id", String(40), ForeignKey("barge_api_keys.id"), nullable=False),   # the owner
    Column("purpose", String(32), nullable=False),        # "batch" (uploaded) | "batch_output" (written)
    Column("filename", String(255), nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("url", Text, nullable=False),                  # where the bytes are (path or fsspec URL)
    Column("created_at", Float, nullable=False),
    Column("deleted_at", Float),
    Index("ix_barge_api_files_owner", "key_id", "created_at"),
)

api_batches = Table(
    "barge_api_batches", metadata,
    Column("id", String(40), primary_key=True),           # "batch_..."
    Column("key_id", String(40), ForeignKey("barge_api_keys.id"), nullable=False),   # the owner
    Column("job_id", String(32)),                         # NULL: refused at validation (then `errors` says why)
    Column("endpoint", String(40), nullable=False),       # "/v1/chat/completions" | "/v1/completions" | "/v1/embeddings"
    Column("model", String(200)),
    Column("input_file_id", String(40), nullable=False),
    Column("completion_window", String(16), nullable=False),
    Column("metadata", Text, nullable=False),             # JSON object of strings
    Column("errors", Text),                               # JSON list of OpenAI BatchError objects
    Column("num_requests", Integer, nullable=False),      # lines of the input file
    Column("num_completed", Integer),                     # set when the output is written
    Column("num_failed", Integer),
    Column("usage", Text),                                # JSON {input_tokens, output_tokens}, set when settled
    Column("output_file_id", String(40)),
    Column("error_file_id", String(40)),
    Column("created_at", Float, nullable=False),
    Column("cancelling_at", Float),
    Column("settled_at", Float),                          # output and error files written: the batch is final
    Index("ix_barge_api_batches_owner", "key_id", "created_at"),
    Index("ix_barge_api_batches_job", "job_id"),          # the dashboard's jobs list joins jobs to owners (0016)
)


def newest_first_page(engine: Engine, table: Table, query: Select, cursor, limit: int,
                      to_record: Callable) -> tuple[list, bool]:
    """One page of `query` over `table`, newest first, after `cursor` (a record of that table,
    or None for the first page: OpenAI's `after`), as records; and whether more follow.
    Ties in created_at are broken by id, so a page never repeats or skips a row."""
    c = table.c
    if cursor is not None:
        query = query.where((c.created_at < cursor.created_at)
                            | ((c.created_at == cursor.created_at) & (c.id < cursor.id)))
    query = query.order_by(c.created_at.desc(), c.id.desc()).limit(limit + 1)
    with engine.connect() as conn:
        records = [to_record(row) for row in conn.execute(query)]
    return records[:limit], len(records) > limit
