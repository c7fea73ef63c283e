"""Shards from Parquet footers: inspect the input, then plan pure and deterministic.

Only footers are read here, never data pages. The plan depends on nothing but
the footers' row counts, so planning the same input twice gives the same
shards, and a re-delivered shard task reads exactly the same rows again.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from storage.errors import InputError
from storage.fs import open_for_read, redact, resolve
from storage.listing import list_input_files

# The role whose column feeds the engine's text: it must hold strings.
TEXT_ROLE = "input_column"
MAX_CONCURRENT_FOOTER_READS = 16


@dataclass(frozen=True)
class InputFile:
    """One input Parquet file, as its footer describes it."""

    url: str  # resolvable by storage.fs.resolve (local files are plain paths)
    num_rows: int
    num_row_groups: int
    row_group_rows: tuple[int, ...]  # row_group_index -> num_rows in that row group

    def __post_init__(self) -> None:
        if len(self.row_group_rows) != self.num_row_groups:
            raise ValueError(f"{self.url}: {len(self.row_group_rows)} row group sizes for {self.num_row_groups} row groups")
        if sum(self.row_group_rows) != self.num_rows:
            raise ValueError(f"{self.url}: row groups hold {sum(self.row_group_rows)} rows, not {self.num_rows}")


@dataclass(frozen=True)
class InputInfo:
    """Everything the planner needs to know about a job's input."""

    files: tuple[InputFile, ...]  # file_index -> file, in listing order
    schema: pa.Schema  # shared by every file (metadata, nullability and field order aside)
    num_rows: int  # over all files


@dataclass(frozen=True)
class ShardPlan:
    """A contiguous run of rows in one file: the unit of work of one shard task."""

    shard_index: int  # position in the job's plan, 0..num_shards-1 over all files
    file_index: int  # index into InputInfo.files
    url: str
    row_groups: tuple[int, ...]  # consecutive row group indices that hold the rows
    row_start: int  # offset within the file of this shard's first row
    num_rows: int


def inspect_input(
    input: str | list[str],
    *,
    columns: dict[str, str],
    storage_options: dict | None = None,
) -> InputInfo:
    """List the input files and check their footers agree with each other and the job.

    `columns` maps role -> column name, e.g. {"input_column": "text", "id_column": "doc_id"};
    a role mapped to None is skipped. Every column must exist in every file, and the
    column for "input_column" must hold strings. Raises InputError naming the file and
    the problem. An empty file (0 rows) is valid: it yields no shards.
    """
    urls = list_input_files(input, storage_options)
    files: list[InputFile] = []
    schema: pa.Schema | None = None
    for url, metadata in zip(urls, _read_footers(urls, storage_options)):
        file_schema = _arrow_schema(url, metadata)
        _check_columns(url, file_schema, columns)
        if schema is None:
            schema = file_schema
        else:
            _check_same_schema(url, urls[0], schema, file_schema)
        files.append(_input_file(url, metadata))
    return InputInfo(files=tuple(files), schema=schema, num_rows=sum(f.num_rows for f in files))


def plan_shards(info: InputInfo, *, max_rows_per_shard: int = 2048) -> list[ShardPlan]:
    """Cut every file into shards of at most `max_rows_per_shard` rows.

    Shards follow row-group boundaries: consecutive row groups are grouped while
    they fit. A row group bigger than the limit becomes shards of its own, split
    by row range into near-equal pieces. Empty row groups start no shard.
    Every row of every file is in exactly one shard.
    """
    if max_rows_per_shard < 1:
        raise ValueError(f"max_rows_per_shard must be at least 1, got {max_rows_per_shard}")
    shards: list[ShardPlan] = []
    for file_index, input_file in enumerate(info.files):
        for row_groups, row_start, num_rows in _file_row_ranges(input_file.row_group_rows, max_rows_per_shard):
            shards.append(ShardPlan(
                shard_index=len(shards),
                file_index=file_index,
                url=input_file.url,
                row_groups=row_groups,
                row_start=row_start,
                num_rows=num_rows,
            ))
    return shards


def _file_row_ranges(row_group_rows: tuple[int, ...], max_rows: int) -> list[tuple[tuple[int, ...], int, int]]:
    """(row_groups, row_start, num_rows) for each shard of one file."""
    ranges: list[tuple[tuple[int, ...], int, int]] = []
    pending: list[int] = []  # row groups gathered for the next shard
    pending_start = pending_rows = 0
    row_group_start = 0  # offset in the file of the current row group's first row
    for index, num_rows in enumerate(row_group_rows):
        if pending and pending_rows + num_rows > max_rows:
            ranges.append((tuple(pending), pending_start, pending_rows))
            pending, pending_rows = [], 0
        if num_rows > max_rows:
            ranges.extend(((index,), row_group_start + offset, size) for offset, size in _split(num_rows, max_rows))
        elif num_rows > 0 or pending:  # an empty group inside a run keeps the run consecutive
            if not pending:
                pending_start = row_group_start
            pending.append(index)
            pending_rows += num_rows
        row_group_start += num_rows
    if pending:
        ranges.append((tuple(pending), pending_start, pending_rows))
    return ranges


def _split(num_rows: int, max_rows: int) -> list[tuple[int, int]]:
    """(offset, size) of the fewest near-equal pieces of at most `max_rows` rows."""
    num_pieces = -(-num_rows // max_rows)
    base, remainder = divmod(num_rows, num_pieces)
    pieces, offset = [], 0
    for piece in range(num_pieces):
        size = base + (1 if piece < remainder else 0)
        pieces.append((offset, size))
        offset += size
    return pieces


def _read_footers(urls: list[str], storage_options: dict | None) -> list[pq.FileMetaData]:
    """Footers in `urls` order, fetched concurrently: on S3 each costs a round trip or two.

    The first unreadable file in `urls` order raises; footers not yet fetched are dropped.
    """
    pool = ThreadPoolExecutor(max_workers=MAX_CONCURRENT_FOOTER_READS)
    try:
        return list(pool.map(lambda url: _read_footer(url, storage_options), urls))
    finally:
        pool.shutdown(cancel_futures=True)


def _read_footer(url: str, storage_options: dict | None) -> pq.FileMetaData:
    fs, path = resolve(url, storage_options)
    try:
        with open_for_read(fs, path) as source, pq.ParquetFile(source) as parquet_file:
            return parquet_file.metadata
    except (pa.ArrowException, OSError) as error:
        raise InputError(f"{redact(url)}: not a Parquet file, or its footer is corrupt ({error})") from error


def _arrow_schema(url: str, metadata: pq.FileMetaData) -> pa.Schema:
    try:
        return metadata.schema.to_arrow_schema()
    except (pa.ArrowException, ValueError) as error:
        raise InputError(f"{redact(url)}: its Parquet schema has no Arrow equivalent ({error})") from error


def _input_file(url: str, metadata: pq.FileMetaData) -> InputFile:
    row_group_rows = tuple(metadata.row_group(i).num_rows for i in range(metadata.num_row_groups))
    return InputFile(url=url, num_rows=metadata.num_rows, num_row_groups=metadata.num_row_groups,
                     row_group_rows=row_group_rows)


def _check_columns(url: str, schema: pa.Schema, columns: dict[str, str]) -> None:
    for role, name in columns.items():
        if name is None:
            continue
        if schema.get_field_index(name) < 0:
            raise InputError(
                f"{redact(url)}: column {name!r} (the {role}) is not in the file; "
                f"its columns are: {', '.join(schema.names)}"
            )
        column_type = schema.field(name).type
        if role == TEXT_ROLE and not _is_string(column_type):
            raise InputError(
                f"{redact(url)}: column {name!r} (the {role}) has type {column_type}; "
                f"it must be string or large_string"
            )


def _is_string(column_type: pa.DataType) -> bool:
    return pa.types.is_string(column_type) or pa.types.is_large_string(column_type)


def _check_same_schema(url: str, first_url: str, expected: pa.Schema, actual: pa.Schema) -> None:
    difference = schema_difference(expected, actual)
    if difference:
        raise InputError(f"{redact(url)}: schema differs from {redact(first_url)}: {difference}")


def schema_difference(expected: pa.Schema, actual: pa.Schema) -> str | None:
    """What differs between two schemas by column name and type, or None.

    Field order, nullability and metadata (e.g. the pandas index) are ignored:
    rows are read by column name, and writers differ on those freely.
    """
    expected_types = {field.name: field.type for field in expected}
    actual_types = {field.name: field.type for field in actual}
    problems = []
    missing = [name for name in expected_types if name not in actual_types]
    extra = [name for name in actual_types if name not in expected_types]
    if missing:
        problems.append(f"missing columns {missing}")
    if extra:
        problems.append(f"extra columns {extra}")
    for name, expected_type in expected_types.items():
        actual_type = actual_types.get(name)
        if actual_type is not None and actual_type != expected_type:
            problems.append(f"column {name!r} is {actual_type}, not {expected_type}")
    return "; ".join(problems) or None
