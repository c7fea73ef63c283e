"""The results cache's index in SQL: which Parquet file row holds the result for a
(namespace, key), when it was last used, and its removal by retention.

The values themselves are Parquet files (queueing.result_cache writes and reads them);
SQL holds only hashes and file rows, so the index stays small beside a corpus of
embeddings. Entries are written after their file is complete, and a lookup that
finds a file gone drops that file's entries: a half-written or removed file can cost a
recomputation, never a wrong row. The index is every host's, its files perhaps one
host's: what a host may drop or delete is jobs.cache_reach's rule, and each drop names
the URL it found gone, so that a file moved meanwhile (jobs.cache_move) keeps its row.
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
class CacheFile:
    id: str
    namespace: str
    url: str          # where the file is; the same row may be moved to another URL


@dataclass(frozen=True)
class CachePruned:
    entries: int                  # entries removed
    files: list[CacheFile]        # files no entry points at any more: still indexed, until the
                                  # caller deleted each through its URL and forgets it

    @property
    def file_urls(self) -> list[str]:
        return [file.url for file in self.files]


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

    def cache_forget_files(self, files: dict[str, str]) -> None:
        """Drop files found gone (file id -> the URL found gone), with their entries; a
        file whose row names another URL by now (moved meanwhile) stays."""
        file = tables.cache_files.c
        with self.engine.begin() as conn:
            for file_id, url in files.items():
                if conn.execute(delete(tables.cache_files).where(file.id == file_id, file.url == url)).rowcount:
                    conn.execute(delete(tables.cache_entries).where(tables.cache_entries.c.file_id == file_id))

    def cache_prune(self, namespaces: list[str], unused_since: float, *, dry_run: bool = False) -> CachePruned:
        """Remove the entries of `namespaces` not used since `unused_since`, and list the
        files left without entries. Their rows stay until the caller, having deleted a
        file, forgets it (cache_forget_files): a file on another host's disk stays
        indexed until that host prunes it."""
        entry = tables.cache_entries.c
        stale = (entry.namespace.in_(namespaces)) & (entry.used_at < unused_since)
        with self.engine.begin() as conn:
            num_entries = conn.execute(select(func.count()).where(stale)).scalar_one()
            if not dry_run:
                conn.execute(delete(tables.cache_entries).where(stale))
            orphans = self._orphan_files(conn, namespaces, stale if dry_run else None)
        return CachePruned(entries=num_entries, files=orphans)

    def _orphan_files(self, conn: Connection, namespaces: list[str], removed) -> list[CacheFile]:
        entry, file = tables.cache_entries.c, tables.cache_files.c
        live = select(entry.file_id).where(entry.file_id == file.id)
        if removed is not None:   # dry run: entries about to be removed do not count as live
            live = live.where(~removed)
        query = select(file.id, file.namespace, file.url).where(file.namespace.in_(namespaces), ~live.exists())
        return [CacheFile(*row) for row in conn.execute(query.order_by(file.created_at, file.id))]

    def cache_files(self) -> list[CacheFile]:
        """Every indexed file (one per shard attempt that computed rows)."""
        file = tables.cache_files.c
        with self.engine.connect() as conn:
            query = select(file.id, file.namespace, file.url).order_by(file.created_at, file.id)
            return [CacheFile(*row) for row in conn.execute(query)]

    def cache_indexed_urls(self, urls: list[str]) -> set[str]:
        """Those of `urls` that an indexed file has."""
        file = tables.cache_files.c
        found: set[str] = set()
        with self.engine.connect() as conn:
            for start in range(0, len(urls), LOOKUP_BATCH):
                found.update(conn.execute(select(file.url).where(file.url.in_(urls[start:start + LOOKUP_BATCH]))
                                          ).scalars())
        return found

    def cache_move_file(self, file_id: str, old_url: str, new_url: str) -> bool:
        """Point a file's entries at its copy, in one statement: only if its row still
        names `old_url` (False: pruned or moved meanwhile, nothing changed)."""
        file = tables.cache_files.c
        with self.engine.begin() as conn:
            return conn.execute(update(tables.cache_files).values(url=new_url)
                                .where(file.id == file_id, file.url == old_url)).rowcount == 1

    def cache_size(self, namespace: str) -> int:
        with self.engine.connect() as conn:
            return conn.execute(select(func.count()).where(tables.cache_entries.c.namespace == namespace)).scalar_one()

    def _insert_ignoring_duplicates(self, conn: Connection, rows: list[dict]) -> None:
        if not rows:
            return
        dialect = sqlite if self.is_sqlite else postgresql
        conn.execute(dialect.insert(tables.cache_entries).values(rows).on_conflict_do_nothing())
