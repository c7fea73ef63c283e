"""The results cache of incremental jobs, as one shard sees it: which of its rows
have a cached result (read back from the cache's Parquet files), and, after the
engine ran the others, a new cache file with their results.

Cache files live under BARGE_CACHE_URL (default: the data directory's `cache/`), one
folder per namespace, one file per shard attempt that computed rows. A cached value
is the row's result columns exactly as an output part holds them, so a reused row is
byte-for-byte the row an earlier job wrote. Rows with an error are not cached: a
failed row is tried again by the next job.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.cache_keys import keys_depend_on_row_id, row_key
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

    @property
    def num_hits(self) -> int:
        return len(self.hit_rows)

    def miss_rows(self, num_rows: int) -> list[int]:
        hits = set(self.hit_rows)
        return [i for i in range(num_rows) if i not in hits]


@dataclass(frozen=True)
class CacheWrite:
    url: str                         # the cache file holding this attempt's computed results
    key_rows: list[tuple[str, int]]  # (key, row in that file), to index after the commit
    hit_keys: list[str]              # keys reused: marked as used after the commit


class ResultCache:
    def __init__(self, store: Store, root_url: str, job: JobRecord, result_columns: list[str]):
        self.store = store
        self.namespace = job.cache_namespace
        self.folder = join(root_url.rstrip("/"), self.namespace)
        self.job = job
        self.result_columns = result_columns   # the output's columns that a cache value holds

    def lookup(self, ids: pa.Array, inputs: list) -> CachedRows:
        with_id = keys_depend_on_row_id(self.job.spec)
        keys = [row_key(value, row_id if with_id else None) for value, row_id in zip(inputs, ids.to_pylist())]
        hits = self.store.cache_lookup(self.namespace, [k for k in keys if k is not None])
        by_file: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            if key in hits:
                by_file.setdefault(hits[key].file_id, []).append(i)
        pieces, hit_rows, unreadable = [], [], []
        for file_id, rows in by_file.items():
            first = hits[keys[rows[0]]]
            table = self._read(first.url)
            if table is None:
                unreadable.append(file_id)
                continue
            pieces.append(table.take(pa.array([hits[keys[i]].row for i in rows])))
            hit_rows.extend(rows)
        if unreadable:   # removed or damaged: its rows are computed again, and it leaves the index
            self.store.cache_forget_files(unreadable)
        if not hit_rows:
            return CachedRows(keys, [], None)
        order = sorted(range(len(hit_rows)), key=hit_rows.__getitem__)
        table = pa.concat_tables(pieces).take(pa.array(order))
        return CachedRows(keys, sorted(hit_rows), table)

    def save(self, shard_index: int, attempt: int, keys: list[str | None], computed: pa.Table,
             cached: CachedRows) -> CacheWrite | None:
        """Write the computed rows that succeeded (`computed`: the shard's output rows the
        engine produced, `keys` theirs) as a new cache file; index it after the commit."""
        ok = [i for i, key in enumerate(keys) if key is not None and computed.column("error")[i].as_py() is None]
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

    def _read(self, url: str) -> pa.Table | None:
        try:
            fs, path = resolve(url)
            with open_for_read(fs, path) as source:
                return pq.read_table(source, columns=self.result_columns)
        except Exception as exc:  # noqa: BLE001 - a missing or damaged file is a cache miss
            log.warning("cache file %s unreadable, computing its rows again: %s", redact_url(url),
                        redact_text(str(exc)))
            return None


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
