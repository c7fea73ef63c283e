"""Re-lay row groups bigger than a shard into staged files, one per shard piece, so
each such row group is fetched once over the whole job.

Parquet reads column chunks, not row ranges: before staging, every shard cut from a
200,000-row row group fetched the whole group (98 shards, 98 times its bytes). Here
planning streams each such row group once, projected to the columns the job reads,
and writes each piece's rows as its own small Parquet file:

    input  a.parquet   [ row group 0: 200,000 rows ........................... ]
                         |  one read of the projected column chunks
    staged OUTPUT/_barge_staging/JOB/00000-000000000000.parquet  rows      0..2041
           OUTPUT/_barge_staging/JOB/00000-000000002041.parquet  rows   2041..4082
           ...                                                   (one per piece)

A shard then reads its staged file whole, in one GET. Staging is deterministic (same
rows, same names), so re-planning a job writes the same files; storage.manifest
removes a job's staging folder once its output is committed, and a shard whose
staged file has gone reads its rows from the input instead (storage.read).
"""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pyarrow as pa

from storage.footer import open_parquet, read_footer
from storage.errors import InputError
from storage.fs import is_object_store, join, redact, resolve
from storage.plan import ShardPiece, ShardPlan
from storage.write import table_to_parquet_bytes, write_bytes_atomic

log = logging.getLogger("barge.storage")

STAGING_FOLDER = "_barge_staging"  # under the job's output; "_" keeps listings of the output from taking it
STAGE_BATCH_ROWS = 8192


@dataclass(frozen=True)
class StagingReport:
    num_row_groups: int = 0  # row groups re-laid
    num_files: int = 0  # staged files written: one per split piece
    num_bytes_written: int = 0
    seconds: float = 0.0


def staging_url(output: str, job_id: str) -> str:
    return join(join(output, STAGING_FOLDER), job_id)


def stage_split_pieces(shards: list[ShardPlan], columns: list[str], staging: str,
                       storage_options: dict | None = None) -> tuple[list[ShardPlan], StagingReport]:
    """`shards` with every split piece pointed at a staged file holding exactly its rows.

    Each split row group is read once (only `columns`); shards without split pieces
    come back unchanged. Raises InputError when an input no longer matches the plan.
    """
    started = time.monotonic()
    by_group: dict[tuple[int, int], list[ShardPiece]] = {}  # (file_index, row group) -> its pieces, in order
    for piece in (p for shard in shards for p in shard.pieces if p.is_split):
        by_group.setdefault((piece.file_index, piece.row_groups[0]), []).append(piece)
    staged: dict[tuple[int, int], str] = {}  # (file_index, row_start) -> staged URL
    num_bytes = 0
    for pieces in by_group.values():
        for piece, table in zip(pieces, _piece_tables(pieces, columns, storage_options)):
            name = f"{piece.file_index:05d}-{piece.row_start:012d}.parquet"
            data = table_to_parquet_bytes(table)
            write_bytes_atomic(staging, name, data, storage_options)
            staged[(piece.file_index, piece.row_start)] = join(staging, name)
            num_bytes += len(data)
    restaged = [replace(shard, pieces=tuple(_with_staged_url(piece, staged) for piece in shard.pieces))
                for shard in shards]
    return restaged, StagingReport(len(by_group), len(staged), num_bytes, time.monotonic() - started)


def _with_staged_url(piece: ShardPiece, staged: dict[tuple[int, int], str]) -> ShardPiece:
    url = staged.get((piece.file_index, piece.row_start)) if piece.is_split else None
    return replace(piece, staged_url=url) if url else piece


def _piece_tables(pieces: list[ShardPiece], columns: list[str],
                  storage_options: dict | None) -> Iterator[pa.Table]:
    """The rows of `pieces` (consecutive row ranges of one row group, in order), one table
    each, from a single streaming read of that row group."""
    first = pieces[0]
    fs, path = resolve(first.url, storage_options)
    with open_parquet(fs, path, read_footer(fs, path, first.url, first.file_bytes)) as parquet_file:
        metadata = parquet_file.metadata
        position = sum(metadata.row_group(i).num_rows for i in range(first.row_groups[0]))  # of `pending`'s first row
        batches = parquet_file.iter_batches(batch_size=STAGE_BATCH_ROWS, row_groups=list(first.row_groups),
                                            columns=columns, use_threads=False)
        pending = pa.schema([parquet_file.schema_arrow.field(name) for name in columns]).empty_table()
        for piece in pieces:
            end = piece.row_start - position + piece.num_rows  # within `pending`
            while pending.num_rows < end:
                batch = next(batches, None)
                if batch is None:
                    raise InputError(f"{redact(first.url)}: row group {first.row_groups[0]} ends before row "
                                     f"{piece.row_start + piece.num_rows}; its footer lies")
                pending = pa.concat_tables([pending, pa.Table.from_batches([batch.select(columns)])])
            yield pending.slice(piece.row_start - position, piece.num_rows)
            pending = pending.slice(end)
            position = piece.row_start + piece.num_rows


def remove_staging(output: str, job_id: str, storage_options: dict | None = None) -> None:
    """Remove a job's staged files, and the staging folder once no job has any there; a
    failure leaves only unlisted files behind, so it is not raised."""
    fs, path = resolve(staging_url(output, job_id), storage_options)
    root = posixpath.dirname(path.rstrip("/"))
    try:
        if fs.exists(path):
            fs.rm(path, recursive=True)
        if not is_object_store(fs) and fs.isdir(root) and not fs.ls(root):   # object stores have no folders
            fs.rmdir(root)
    except OSError:
        log.warning("%s: could not remove the staged files", redact(staging_url(output, job_id)), exc_info=True)
