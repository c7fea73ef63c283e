"""Stream the rows of one shard, piece by piece, a bounded batch at a time.

Each piece is read the cheapest way its file allows:
  - a staged piece (storage.stage, storage.bundle) or a small remote file (<= WHOLE_FILE_BYTES):
    the whole object in one GET, fetched up to MAX_CONCURRENT_FETCHES objects ahead,
    so a shard packed from a thousand tiny files is not a thousand round trips in a row;
    consecutive pieces staged in one bundle share its GET and its decoding;
  - any other file: its footer as one small tail read (storage.footer), then only
    the piece's row groups' projected column chunks, one ranged GET each.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import groupby

import pyarrow as pa
import pyarrow.parquet as pq

from storage.errors import InputError
from storage.footer import WHOLE_FILE_BYTES, open_parquet, read_footer  # noqa: F401 - WHOLE_FILE_BYTES re-exported
from storage.fs import describe, is_local, redact, resolve
from storage.plan import ShardPiece, ShardPlan

log = logging.getLogger("barge.storage")

MAX_CONCURRENT_FETCHES = 16


def read_shard(
    shard: ShardPlan,
    columns: list[str],
    *,
    batch_size: int = 1024,
    storage_options: dict | None = None,
    partition_columns: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Yield exactly the shard's rows, piece after piece, only `columns` (in that order), <= batch_size rows a batch.

    Only the pieces' row groups are read, and of them only `columns`' chunks: the
    input, id and carried-through columns cost bytes, the others none. Memory is
    bounded by one row group's projected column chunks plus the whole-file fetches
    in flight plus one batch. With `partition_columns`, each piece's hive partition
    values follow as constant string columns, one per key in `piece.partition`
    order. Raises InputError when a file no longer matches the plan (it changed
    since planning, or its footer promises rows it does not hold) or lacks a column.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    bundle = _Bundle()
    for piece, fetched in zip(shard.pieces, _fetched(shard.pieces, storage_options)):
        for batch in _read_piece(piece, fetched, columns, batch_size, storage_options, bundle):
            yield _with_partition(batch, piece.partition) if partition_columns else batch


class _Bundle:
    """The last bundle decoded (storage.bundle): its pieces come one after another."""

    def __init__(self) -> None:
        self.url: str | None = None
        self.table: pa.Table | None = None

    def rows(self, piece: ShardPiece, source, columns: list[str]) -> pa.Table:
        if self.url != piece.staged_url:
            self.url, self.table = None, None   # the previous one is not needed again
            with pq.ParquetFile(source) as parquet_file:
                _check_columns(piece.staged_url, parquet_file.schema_arrow, columns)
                self.table = parquet_file.read(columns=columns, use_threads=False).select(columns)
            self.url = piece.staged_url
        return self.table.slice(piece.staged_row_start, piece.num_rows)


def _read_piece(piece: ShardPiece, fetched: tuple[str, bytes | str] | None, columns: list[str],
                batch_size: int, storage_options: dict | None, bundle: _Bundle) -> Iterator[pa.RecordBatch]:
    url = fetched[0] if fetched else piece.url
    try:
        if fetched is None:
            yield from _read_in_place(piece, columns, batch_size, storage_options)
            return
        source = pa.BufferReader(fetched[1]) if isinstance(fetched[1], bytes) else fetched[1]
        if url == piece.staged_url and not piece.is_split:
            rows = bundle.rows(piece, source, columns)
            yield from _counted(piece, rows.to_batches(max_chunksize=batch_size))
        elif url == piece.staged_url:
            yield from _read_staged(piece, source, columns, batch_size)
        else:
            yield from _read_rows(piece, pq.ParquetFile(source), columns, batch_size)
    except (pa.ArrowException, OSError) as error:
        raise InputError(f"{redact(url)}: cannot read rows {piece.row_start}..{piece.row_start + piece.num_rows} "
                         f"({describe(error, storage_options)})") from error


def _read_in_place(piece: ShardPiece, columns: list[str], batch_size: int,
                   storage_options: dict | None) -> Iterator[pa.RecordBatch]:
    fs, path = resolve(piece.url, storage_options)
    with open_parquet(fs, path, read_footer(fs, path, piece.url, piece.file_bytes)) as parquet_file:
        yield from _read_rows(piece, parquet_file, columns, batch_size)


def _read_rows(piece: ShardPiece, parquet_file: pq.ParquetFile, columns: list[str],
               batch_size: int) -> Iterator[pa.RecordBatch]:
    skip = _rows_to_skip(piece, parquet_file.metadata)
    _check_columns(piece.url, parquet_file.schema_arrow, columns)
    batches = parquet_file.iter_batches(batch_size=batch_size, row_groups=list(piece.row_groups),
                                        columns=columns, use_threads=False)
    yield from _counted(piece, _row_range(batches, skip, piece.num_rows, columns))


def _read_staged(piece: ShardPiece, source, columns: list[str], batch_size: int) -> Iterator[pa.RecordBatch]:
    """A staged file holds exactly the piece's rows."""
    with pq.ParquetFile(source) as parquet_file:
        _check_columns(piece.staged_url, parquet_file.schema_arrow, columns)
        batches = parquet_file.iter_batches(batch_size=batch_size, columns=columns, use_threads=False)
        yield from _counted(piece, (batch.select(columns) for batch in batches))


def _counted(piece: ShardPiece, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`batches`, checked to hold the piece's rows: a footer that promises rows the data lacks is named."""
    num_rows = 0
    for batch in batches:
        num_rows += batch.num_rows
        yield batch
    if num_rows != piece.num_rows:
        raise InputError(f"{redact(piece.url)}: rows {piece.row_start}..{piece.row_start + piece.num_rows} "
                         f"gave {num_rows} rows; its footer lies, or the file changed since planning")


def _fetched(pieces: tuple[ShardPiece, ...],
             storage_options: dict | None) -> Iterator[tuple[str, bytes | str] | None]:
    """_fetch_whole of each piece, in order, fetched up to MAX_CONCURRENT_FETCHES objects ahead;
    consecutive pieces of one bundle share one fetch."""
    runs = [list(run) for _, run in groupby(pieces, key=lambda p: p.staged_url if p.staged_url and not p.is_split
                                             else id(p))]
    pool = ThreadPoolExecutor(max_workers=MAX_CONCURRENT_FETCHES)
    try:
        upcoming = iter(runs)
        futures = deque((pool.submit(_fetch_whole, run[0], storage_options), len(run))
                        for _, run in zip(range(MAX_CONCURRENT_FETCHES), upcoming))
        while futures:
            future, num_pieces = futures.popleft()
            result = future.result()
            following = next(upcoming, None)
            if following is not None:
                futures.append((pool.submit(_fetch_whole, following[0], storage_options), len(following)))
            for _ in range(num_pieces):
                yield result
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _fetch_whole(piece: ShardPiece, storage_options: dict | None) -> tuple[str, bytes | str] | None:
    """(url, bytes) of the piece's staged file, or of its small remote input file, in one GET
    ((url, path) for a local staged file); None: read the piece in place."""
    if piece.staged_url is not None:
        fs, path = resolve(piece.staged_url, storage_options)
        if is_local(fs):
            return (piece.staged_url, path) if fs.exists(path) else None
        try:
            return piece.staged_url, fs.cat_file(path)
        except FileNotFoundError:   # removed (the job was committed, then retried): the input still has the rows
            log.warning("%s: staged copy gone, reading the rows from the input", redact(piece.staged_url))
            return None
    fs, path = resolve(piece.url, storage_options)
    if is_local(fs) or not 0 < piece.file_bytes <= WHOLE_FILE_BYTES:
        return None
    try:
        return piece.url, fs.cat_file(path)
    except OSError as error:
        raise InputError(f"{redact(piece.url)}: cannot read the file ({describe(error, storage_options)})") from error


def _rows_to_skip(piece: ShardPiece, metadata: pq.FileMetaData) -> int:
    """Rows between the start of the piece's first row group and the piece's first row."""
    first, last = piece.row_groups[0], piece.row_groups[-1]
    if last >= metadata.num_row_groups:
        raise InputError(f"{redact(piece.url)}: has {metadata.num_row_groups} row groups, "
                         f"the plan needs row group {last}; the file changed since planning")
    row_group_start = sum(metadata.row_group(i).num_rows for i in range(first))
    num_rows_in_groups = sum(metadata.row_group(i).num_rows for i in piece.row_groups)
    skip = piece.row_start - row_group_start
    if skip < 0 or skip + piece.num_rows > num_rows_in_groups:
        raise InputError(f"{redact(piece.url)}: rows {piece.row_start}..{piece.row_start + piece.num_rows} "
                         f"are not in row groups {list(piece.row_groups)}; the file changed since planning")
    return skip


def _check_columns(url: str, schema: pa.Schema, columns: list[str]) -> None:
    missing = [name for name in columns if schema.get_field_index(name) < 0]
    if missing:
        raise InputError(f"{redact(url)}: columns {missing} are not in the file; "
                         f"its columns are: {', '.join(schema.names)}")


def _row_range(batches: Iterator[pa.RecordBatch], skip: int, num_rows: int,
               columns: list[str]) -> Iterator[pa.RecordBatch]:
    """Drop the first `skip` rows, then yield `num_rows` rows and stop reading."""
    for batch in batches:
        if num_rows == 0:
            return
        if skip >= batch.num_rows:
            skip -= batch.num_rows
            continue
        piece = batch.slice(skip, num_rows)
        skip = 0
        num_rows -= piece.num_rows
        yield piece.select(columns)


def _with_partition(batch: pa.RecordBatch, partition: dict[str, str | None]) -> pa.RecordBatch:
    """`batch` with one constant string column per partition key appended."""
    arrays = list(batch.columns)
    names = list(batch.schema.names)
    for key, value in partition.items():
        arrays.append(pa.array([value] * batch.num_rows, pa.string()))
        names.append(key)
    return pa.RecordBatch.from_arrays(arrays, names=names)
