"""Stage a shard's small files as one file, from the bytes submit's check already fetched.

A remote file no bigger than the footer's fetch (storage.footer) comes whole with its
footer, so before bundling each tiny file was fetched three times over a job: its
footer at submit, again at planning, and whole by its shard. Submit keeps those bytes'
rows (the columns the job reads: storage.inputs `keep_columns`), and here the small
files that share a shard are written together as one staged file:

    input   f00000.parquet f00001.parquet ... f00682.parquet   (683 tiny files, shard 0)
              \\___________________ rows, read columns _______________/
    staged  OUTPUT/_barge_staging/JOB/small-00000.parquet       one PUT at submit, one GET by the shard

Each bundled InputFile then points at its bundle (`staged_url`, `staged_row_start`), the
plan's pieces follow (storage.plan), and the shard reads one object instead of hundreds.
The bundles are cut along the plan made at submit; planning makes the same plan from
the same inspection (storage.inspection), so they line up. A file whose pieces land in
more than one shard is not bundled. A shard whose bundle has gone reads its files from
the input instead (storage.read), so a lost bundle costs bytes, never rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import pyarrow as pa

from storage.fs import join
from storage.inputs import InputInfo
from storage.plan import ShardPlan
from storage.write import table_to_parquet_bytes, write_bytes_atomic


@dataclass(frozen=True)
class BundleReport:
    num_files: int = 0  # small input files bundled
    num_bundles: int = 0  # staged files written: one per shard that has small files
    num_bytes_written: int = 0
    seconds: float = 0.0


def bundle_name(shard_index: int) -> str:
    return f"small-{shard_index:05d}.parquet"


def stage_small_files(info: InputInfo, shards: list[ShardPlan], columns: list[str], staging: str,
                      storage_options: dict | None = None) -> tuple[InputInfo, BundleReport]:
    """`info` with each file of `info.small_tables` that lies in one shard pointed at that
    shard's bundle, written under `staging`; `shards` is plan_shards(info). Raises
    OutputError when a bundle cannot be written."""
    started = time.monotonic()
    schema = pa.schema([pa.field(name, info.schema.field(name).type) for name in columns])
    files = list(info.files)
    num_files = num_bundles = num_bytes = 0
    for shard_index, file_indices in _bundles(info, shards).items():
        tables, offset, url = [], 0, join(staging, bundle_name(shard_index))
        for file_index in file_indices:
            table = info.small_tables[file_index].select(columns)
            tables.append(table.cast(schema) if table.schema != schema else table)
            files[file_index] = replace(files[file_index], staged_url=url, staged_row_start=offset)
            offset += table.num_rows
        data = table_to_parquet_bytes(pa.concat_tables(tables))
        write_bytes_atomic(staging, bundle_name(shard_index), data, storage_options)
        num_files, num_bundles, num_bytes = num_files + len(file_indices), num_bundles + 1, num_bytes + len(data)
    report = BundleReport(num_files, num_bundles, num_bytes, time.monotonic() - started)
    return replace(info, files=tuple(files), small_tables={}), report


def _bundles(info: InputInfo, shards: list[ShardPlan]) -> dict[int, list[int]]:
    """shard index -> the kept small files wholly inside it, in input order."""
    shards_of: dict[int, set[int]] = {}
    split: set[int] = set()
    for shard in shards:
        for piece in shard.pieces:
            shards_of.setdefault(piece.file_index, set()).add(shard.shard_index)
            if piece.is_split:
                split.add(piece.file_index)
    bundles: dict[int, list[int]] = {}
    for file_index in sorted(info.small_tables):
        owners = shards_of.get(file_index, set())
        if len(owners) == 1 and file_index not in split:
            bundles.setdefault(next(iter(owners)), []).append(file_index)
    return bundles
