"""The results cache's index in SQL: which Parquet file row holds the result for a
(namespace, key), when it was last used, and its removal by retention.

The values themselves are Parquet files (queueing.result_cache writes and reads them);
SQL holds only hashes and file rows, so the index stays small beside a corpus of
embeddings. Entries are written after their file is complete, and a lookup that
finds a missing file drops that file's entries: a half-written or removed file can
cost a recomputation, never a wrong row.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from sqlalchemy import Connection, delete, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite

from jobs import tables

LOOKUP_BATCH = 500    # keys per IN (...) list: far under SQLite's and PostgreSQL's limits


@dataclass(frozen=True)
class CacheHit:
    file_id: str
    url: str          # the Parquet file holding the result
    row: int          # its row in that file


@dataclass(frozen=True)
class CachePruned:
    entries: int                  # entries removed
    file_urls: list[str]          # files no entry points at any more: the caller deletes them


class CacheStore:
    engine: object
    is_sqlite: bool

    def cache_lookup(self, namespace: str, keys: list[str]) -> dict[str, CacheHit]:
        """key -> where its cached result is, for the keys the cache has."""
        entry, file = tables.cache_entries.c, tables.cache_files.c
        hits: dict[str, CacheHit] = {}
        wanted = sorted(set(keys))
        with self.engine.connect() as conn:
            for start in range(0, len(wanted), LOOKUP_BATCH):
                query = (select(entry.key, entry.file_id, file.url, entry.row)
                         .join(tables.cache_files, file.id == entry.file_id)
                         .where(entry.namespace == namespace, entry.key.in_(wanted[start:start + LOOKUP_BATCH])))
                for key, file_id, url, row in conn.execute(query):
                    hits[key] = CacheHit(file_id, url, row)
        return hits

    def cache_register(self, namespace: str, url: str, key_rows: list[tuple[str, int]],
                       now: float | None = None) -> str:
        """Index a complete cache file: `key_rows` are (key, row in the file). A key the
        cache already has keeps its entry (both results are the same result)."""
        now = time.time() if now is None else now
        file_id = uuid.uuid4().hex
        unique = dict(reversed(key_rows))   # the first row of a key repeated within the file
        with self.engine.begin() as conn:
            conn.execute(insert(tables.cache_files).values(id=file_id, namespace=namespace, url=url, created_at=now))
            rows = [dict(namespace=namespace, key=key, file_id=file_id, row=row, created_at=now, used_at=now)
                    for key, row in unique.items()]
            for start in range(0, len(rows), LOOKUP_BATCH):
                self._insert_ignoring_duplicates(conn, rows[start:start + LOOKUP_BATCH])
        return file_id

    def cache_touch(self, namespace: str, keys: list[str], now: float | None = None) -> None:
        """Mark reused entries as used now, so retention keeps what is still read."""
        now = time.time() if now is None else now
        entry = tables.cache_entries.c
        wanted = sorted(set(keys))
        with self.engine.begin() as conn:
            for start in range(0, len(wanted), LOOKUP_BATCH):
                conn.execute(update(tables.cache_entries).values(used_at=now).where(
                    entry.namespace == namespace, entry.key.in_(wanted[start:start + LOOKUP_BATCH])))

    def cache_forget_files(self, file_ids: list[str]) -> None:
        """Drop files that could not be read, with their entries."""
        with self.engine.begin() as conn:
            conn.execute(delete(tables.cache_entries).where(tables.cache_entries.c.file_id.in_(file_ids)))
            conn.execute(delete(tables.cache_files).where(tables.cache_files.c.id.in_(file_ids)))

    def cache_prune(self, namespaces: list[str], unused_since: float, *, dry_run: bool = False) -> CachePruned:
        """Remove the entries of `namespaces` not used since `unused_since`, and the files
        left without entries (returned for the caller to delete from storage)."""
        entry, file = tables.cache_entries.c, tables.cache_files.c
        stale = (entry.namespace.in_(namespaces)) & (entry.used_at < unused_since)
        with self.engine.begin() as conn:
            num_entries = conn.execute(select(func.count()).where(stale)).scalar_one()
            if not dry_run:
                conn.execute(delete(tables.cache_entries).where(stale))
            orphans = self._orphan_files(conn, namespaces, stale if dry_run else None)
            if not dry_run and orphans:
                conn.execute(delete(tables.cache_files).where(file.id.in_([i for i, _ in orphans])))
        return CachePruned(entries=num_entries, file_urls=[url for _, url in orphans])

    def _orphan_files(self, conn: Connection, namespaces: list[str], removed) -> list[tuple[str, str]]:
        entry, file = tables.cache_entries.c, tables.cache_files.c
        live = select(entry.file_id).where(entry.file_id == file.id)
        if removed is not None:   # dry run: entries about to be removed do not count as live
            live = live.where(~removed)
        query = select(file.id, file.url).where(file.namespace.in_(namespaces), ~live.exists())
        return [(file_id, url) for file_id, url in conn.execute(query)]

    def cache_size(self, namespace: str) -> int:
        with self.engine.connect() as conn:
            return conn.execute(select(func.count()).where(tables.cache_entries.c.namespace == namespace)).scalar_one()

    def _insert_ignoring_duplicates(self, conn: Connection, rows: list[dict]) -> None:
        if not rows:
            return
        dialect = sqlite if self.is_sqlite else postgresql
        conn.execute(dialect.insert(tables.cache_entries).values(rows).on_conflict_do_nothing())
