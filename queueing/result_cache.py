"""The results cache of incremental jobs, as one shard sees it: which of its rows
have a cached result (read back from the cache's Parquet files), and, after the
engine ran the others, a new cache file with their results.

Cache files live under BARGE_CACHE_URL (default: the data directory's `cache/`), one
folder per namespace, one file per shard attempt that computed rows. A cached value
is the row's result columns exactly as an output part holds them, so a reused row is
byte-for-byte the row an earlier job wrote. Rows with an error are not cached: a
failed row is tried again by the next job.

A cache file this host cannot read is a miss for this host. Its entries leave the
shared index only when the failure shows the file gone for every host (jobs.cache_reach:
an object store's "no such object", or a path every host shares); a file on another
host's disk stays indexed for that host, and its rows are not cached again from here
(the index keeps one entry per key, the other host's).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.cache_keys import keys_depend_on_row_id, row_key
from jobs.cache_reach import CacheReach
from jobs.cache_store import CacheHit
from jobs.records import JobRecord
from jobs.store import Store
from storage.fs import join, open_for_read, resolve
from storage.redaction import redact_text, redact_url
from storage.write import write_part

log = logging.getLogger("barge.worker")

KEY_COLUMN = "_cache_key"


@dataclass(frozen=True)
class CachedRows:
    keys: list[str | None]       # per row of the shard; None: never cached (null input)
    hit_rows: list[int]          # shard rows served from the cache, ascending
    table: pa.Table | None       # their result columns, in hit_rows order
    unreadable_rows: list[int] = field(default_factory=list)   # indexed, but in a file this host cannot
                                                               # read: computed again, entries kept

    @property
    def num_hits(self) -> int:
        return len(self.hit_rows)

    @property
    def num_unreadable(self) -> int:
        return len(self.unreadable_rows)

    def miss_rows(self, num_rows: int) -> list[int]:
        hits = set(self.hit_rows)
        return [i for i in range(num_rows) if i not in hits]


@dataclass(frozen=True)
class CacheWrite:
    url: str                         # the cache file holding this attempt's computed results
    key_rows: list[tuple[str, int]]  # (key, row in that file), to index after the commit
    hit_keys: list[str]              # keys reused: marked as used after the commit


class ResultCache:
    def __init__(self, store: Store, root_url: str, job: JobRecord, result_columns: list[str], reach: CacheReach):
        self.store = store
        self.namespace = job.cache_namespace
        self.folder = join(root_url.rstrip("/"), self.namespace)
        self.job = job
        self.result_columns = result_columns   # the output's columns that a cache value holds
        self.reach = reach                     # what this host may conclude from a file it cannot read

    def lookup(self, ids: pa.Array, inputs: list, shard_index: int) -> CachedRows:
        with_id = keys_depend_on_row_id(self.job.spec)
        keys = [row_key(value, row_id if with_id else None) for value, row_id in zip(inputs, ids.to_pylist())]
        hits = self.store.cache_lookup(self.namespace, [k for k in keys if k is not None])
        by_file: dict[str, list[int]] = {}   # file id -> the shard's rows it holds
        for i, key in enumerate(keys):
            if key in hits:
                by_file.setdefault(hits[key].file_id, []).append(i)
        pieces, hit_rows, unreadable = [], [], {}   # unreadable: url -> (its rows, why), entries kept
        for rows in by_file.values():
            hit = hits[keys[rows[0]]]
            table = self._read(hit)
            if isinstance(table, Exception):
                unreadable[hit.url] = (rows, table)
            elif table is not None:
                pieces.append(table.take(pa.array([hits[keys[i]].row for i in rows])))
                hit_rows.extend(rows)
        unreadable_rows = sorted(i for rows, _ in unreadable.values() for i in rows)
        if unreadable:
            self._warn_unreadable(shard_index, unreadable, len(unreadable_rows))
        if not hit_rows:
            return CachedRows(keys, [], None, unreadable_rows)
        order = sorted(range(len(hit_rows)), key=hit_rows.__getitem__)
        table = pa.concat_tables(pieces).take(pa.array(order))
        return CachedRows(keys, sorted(hit_rows), table, unreadable_rows)

    def save(self, shard_index: int, attempt: int, keys: list[str | None], computed: pa.Table,
             cached: CachedRows) -> CacheWrite | None:
        """Write the computed rows that succeeded (`computed`: the shard's output rows the
        engine produced, `keys` theirs) as a new cache file; index it after the commit."""
        indexed = {cached.keys[i] for i in cached.unreadable_rows}   # one entry per key: the other host's stays
        ok = [i for i, key in enumerate(keys)
              if key is not None and key not in indexed and computed.column("error")[i].as_py() is None]
        hit_keys = [cached.keys[i] for i in cached.hit_rows]
        if not ok:
            return CacheWrite("", [], hit_keys) if hit_keys else None
        rows = computed.select(self.result_columns).take(pa.array(ok))
        rows = rows.append_column(KEY_COLUMN, pa.array([keys[i] for i in ok], type=pa.string()))
        name = f"part-{self.job.id[:16]}-{shard_index:05d}-{attempt:03d}.parquet"
        write_part(self.folder, name, rows)
        return CacheWrite(join(self.folder, name), [(keys[i], n) for n, i in enumerate(ok)], hit_keys)

    def register(self, write: CacheWrite) -> None:
        if write.key_rows:
            self.store.cache_register(self.namespace, write.url, write.key_rows)
        if write.hit_keys:
            self.store.cache_touch(self.namespace, write.hit_keys)

    def _read(self, hit: CacheHit) -> pa.Table | Exception | None:
        """The file's result columns; why this host cannot read it (a miss here, its
        entries kept); or None for a file gone for every host, now out of the index."""
        try:
            fs, path = resolve(hit.url)
            with open_for_read(fs, path) as source:
                return pq.read_table(source, columns=self.result_columns)
        except Exception as exc:  # noqa: BLE001 - whatever it is, a cache miss; jobs.cache_reach says for whom
            if not self.reach.is_gone(hit.url, exc):
                return exc
            log.warning("cache file %s is gone (%s): its entries leave the index, its rows are computed again",
                        redact_url(hit.url), redact_text(f"{type(exc).__name__}: {exc}"))
            self.store.cache_forget_files({hit.file_id: hit.url})
            return None

    def _warn_unreadable(self, shard_index: int, unreadable: dict[str, tuple[list[int], Exception]],
                         num_rows: int) -> None:
        """Once per shard: many rows of one file would otherwise be many lines."""
        url, (_, exc) = next(iter(unreadable.items()))
        log.warning("job %s shard %d: %d cached rows are in %d cache files this host cannot read (e.g. %s: %s); "
                    "computing them again, their entries stay for the hosts that can read them", self.job.id,
                    shard_index, num_rows, len(unreadable), redact_url(url),
                    redact_text(f"{type(exc).__name__}: {exc}"))


def merge_cached(computed: pa.Table, cached: CachedRows, ids: pa.Array, id_name: str) -> pa.Table:
    """The shard's output rows in input order: the engine's rows (`computed`, for the
    misses in order) beside the cached ones, with the shard's own ids."""
    if cached.table is None:
        return computed
    names = [id_name] + [n for n in computed.column_names if n != id_name]
    reused = {id_name: ids.take(pa.array(cached.hit_rows))}
    for name in names[1:]:   # the result columns, then `error` (null: cached rows succeeded)
        kind = computed.schema.field(name).type
        reused[name] = (cached.table.column(name).cast(kind) if name in cached.table.column_names
                        else pa.nulls(cached.num_hits, kind))
    reused_table = pa.table(reused).cast(pa.schema([computed.schema.field(n) for n in names]))
    whole = pa.concat_tables([computed.select(names), reused_table])
    misses = cached.miss_rows(len(ids))
    position = misses + cached.hit_rows           # row of `whole` -> row of the shard
    order = sorted(range(len(position)), key=position.__getitem__)
    return whole.take(pa.array(order))
