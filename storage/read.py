"""Stream the rows of one shard, a bounded batch at a time."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from storage.errors import InputError
from storage.fs import describe, open_for_read, redact, resolve
from storage.plan import ShardPlan


def read_shard(
    shard: ShardPlan,
    columns: list[str],
    *,
    batch_size: int = 1024,
    storage_options: dict | None = None,
    partition_columns: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Yield exactly the shard's rows, only `columns` (in that order), <= batch_size rows a batch.

    Only the shard's row groups are read, and of them only `columns`' chunks: the
    input, id and carried-through columns cost bytes, the others none. Memory is
    bounded by one row group's projected column chunks plus one batch. With
    `partition_columns`, the shard's hive partition values follow as constant
    string columns, one per key in `shard.partition` order. Raises InputError when
    the file no longer matches the plan (it changed since planning) or lacks a column.

    NOTE: a row group the plan split across shards is fetched whole by each of them
    (Parquet reads column chunks, not row ranges): inputs whose row groups are no
    bigger than a shard are read once, byte for byte.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    fs, path = resolve(shard.url, storage_options)
    try:
        with open_for_read(fs, path) as source, pq.ParquetFile(source) as parquet_file:
            skip = _rows_to_skip(shard, parquet_file.metadata)
            _check_columns(shard, parquet_file.schema_arrow, columns)
            batches = parquet_file.iter_batches(batch_size=batch_size, row_groups=list(shard.row_groups),
                                                columns=columns, use_threads=False)
            for batch in _row_range(batches, skip, shard.num_rows, columns):
                yield _with_partition(batch, shard.partition) if partition_columns else batch
    except (pa.ArrowException, OSError) as error:
        raise InputError(f"{redact(shard.url)}: cannot read shard {shard.shard_index} "
                         f"({describe(error, storage_options)})") from error


def _rows_to_skip(shard: ShardPlan, metadata: pq.FileMetaData) -> int:
    """Rows between the start of the shard's first row group and the shard's first row."""
    first, last = shard.row_groups[0], shard.row_groups[-1]
    if last >= metadata.num_row_groups:
        raise InputError(f"{redact(shard.url)}: has {metadata.num_row_groups} row groups, "
                         f"the plan needs row group {last}; the file changed since planning")
    row_group_start = sum(metadata.row_group(i).num_rows for i in range(first))
    num_rows_in_groups = sum(metadata.row_group(i).num_rows for i in shard.row_groups)
    skip = shard.row_start - row_group_start
    if skip < 0 or skip + shard.num_rows > num_rows_in_groups:
        raise InputError(f"{redact(shard.url)}: rows {shard.row_start}..{shard.row_start + shard.num_rows} "
                         f"are not in row groups {list(shard.row_groups)}; the file changed since planning")
    return skip


def _check_columns(shard: ShardPlan, schema: pa.Schema, columns: list[str]) -> None:
    missing = [name for name in columns if schema.get_field_index(name) < 0]
    if missing:
        raise InputError(f"{redact(shard.url)}: columns {missing} are not in the file; "
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
