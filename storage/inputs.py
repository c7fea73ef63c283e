"""A job's input as its Parquet footers describe it: list the files, read the footers, check them.

Only footers are read here, never data pages: row counts, column types and each
row group's uncompressed byte sizes are all the planner needs.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from storage.errors import InputError
from storage.footer import FOOTER_GUESS_BYTES, WHOLE_FILE_BYTES, Footer, open_parquet, read_footer
from storage.ids import IdSummary, summarize_ids
from storage.fs import describe, redact, resolve
from storage.listing import ListedFile, list_inputs
from storage.text import TEXT_TYPES, is_messages_type, is_pair_type, is_text_type
from storage.work import TOKENS, estimate_work, work_unit

# Roles whose column feeds the engine's text: each must hold strings (or chat messages, or
# pairs of texts: storage.text). A score job reads a query and a document column.
TEXT_ROLES = ("input_column", "params.query_column", "params.document_column")
AUDIO_ROLE = "audio_column"
MAX_CONCURRENT_FOOTER_READS = 16
# At most this many bytes of small files' rows are kept in memory by inspect_input(keep_columns=...);
# the files past it are fetched again by their shards.
MAX_KEPT_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class InputFile:
    """One input Parquet file, as its footer describes it."""

    url: str  # resolvable by storage.fs.resolve (local files are plain paths)
    num_rows: int
    num_row_groups: int
    row_group_rows: tuple[int, ...]  # row_group_index -> num_rows in that row group
    # row_group_index -> estimated work (InputInfo.work_unit) of the input column; () when unknown
    row_group_work: tuple[int, ...] = ()
    # row -> work, when known per row (storage.durations: audio seconds from the headers); () otherwise
    row_work: tuple[int, ...] = ()
    # hive partition key -> value from the file's `key=value` directories, outermost first
    partition: dict[str, str | None] = field(default_factory=dict)
    num_bytes: int = 0  # the file's size; 0 when unknown
    num_read_bytes: int = 0  # compressed bytes of the column chunks of the columns the job reads, plus the footer
    # set by storage.bundle: a staged file holding this file's read columns from row staged_row_start on
    staged_url: str | None = None
    staged_row_start: int = 0

    def __post_init__(self) -> None:
        if len(self.row_group_rows) != self.num_row_groups:
            raise ValueError(f"{self.url}: {len(self.row_group_rows)} row group sizes for {self.num_row_groups} row groups")
        if sum(self.row_group_rows) != self.num_rows:
            raise ValueError(f"{self.url}: row groups hold {sum(self.row_group_rows)} rows, not {self.num_rows}")
        if self.row_group_work and len(self.row_group_work) != self.num_row_groups:
            raise ValueError(f"{self.url}: {len(self.row_group_work)} work estimates for {self.num_row_groups} row groups")


@dataclass(frozen=True)
class InputInfo:
    """Everything the planner needs to know about a job's input."""

    files: tuple[InputFile, ...]  # file_index -> file, in listing order
    schema: pa.Schema  # shared by every file (metadata, nullability and field order aside)
    num_rows: int  # over all files
    work_unit: str = TOKENS  # unit of InputFile.row_group_work: "tokens" | "audio_seconds"
    # partition keys every file shares, in directory order; set when inspect_input(partition_columns=True)
    partition_keys: tuple[str, ...] = ()
    ids: IdSummary | None = None  # the id column's nulls and duplicates; set when inspect_input(summarize_ids=True)
    # file_index -> the `keep_columns` rows of a file whose footer's fetch held it whole (storage.bundle
    # stages them, so no shard fetches the file again); only with inspect_input(keep_columns=...)
    small_tables: dict[int, pa.Table] = field(default_factory=dict, compare=False, repr=False)

    @property
    def total_work(self) -> int:
        return sum(sum(f.row_group_work) for f in self.files)


def inspect_input(
    input: str | list[str],
    *,
    columns: dict[str, str],
    storage_options: dict | None = None,
    carry_columns: Sequence[str] = (),
    partition_columns: bool = False,
    summarize_ids: bool = False,
    keep_columns: Sequence[str] = (),
) -> InputInfo:
    """List the input files and check their footers agree with each other and the job.

    `columns` maps role -> column name, e.g. {"input_column": "text", "id_column": "doc_id"};
    a role mapped to None is skipped. Every column must exist in every file, and the
    column for "input_column" must hold strings. `carry_columns` are further columns
    the job copies into its output: each must exist too. With `partition_columns`,
    every file must have the same hive partition keys, none of them also a column.
    Raises InputError naming the file and the problem. An empty file (0 rows) is
    valid: it yields no shards, and only its columns' presence is checked, not their
    types (pandas writes an empty text column as type null). With `summarize_ids`, the "id_column" role's column
    is read too (that column only; a small file's from the footer's fetch) and
    counted into `InputInfo.ids`. With `keep_columns`, each remote file of up to
    WHOLE_FILE_BYTES (which its shard would fetch whole anyway) is fetched whole for its
    footer, and its rows (those columns only) kept in `InputInfo.small_tables`, up to
    MAX_KEPT_BYTES in all.
    """
    listed = list_inputs(input, storage_options)
    id_column = columns.get("id_column") if summarize_ids else None
    read = _read_footers(listed, storage_options, id_column, tuple(keep_columns))
    footers = [footer for footer, _, _ in read]
    first = next((i for i, footer in enumerate(footers) if footer.metadata.num_rows), 0)  # whose types count
    schema = _arrow_schema(listed[first].url, footers[first].metadata)
    work_columns = _work_columns(columns)
    # Text is counted in tokens whatever its Parquet type (storage.text); audio as its type says.
    audio = columns.get(AUDIO_ROLE)
    unit = work_unit(schema.field(audio).type) if audio and audio in schema.names else TOKENS
    files = []
    for entry, footer in zip(listed, footers):
        metadata, num_bytes = footer.metadata, footer.num_bytes
        file_schema = _arrow_schema(entry.url, metadata)
        _check_columns(entry.url, file_schema, columns, carry_columns, check_types=metadata.num_rows > 0)
        if metadata.num_rows:
            _check_same_schema(entry.url, listed[first].url, schema, file_schema)
        read_names = {name for name in columns.values() if name} | set(carry_columns)
        files.append(_input_file(entry, metadata, num_bytes, work_columns, unit, read_names))
    keys = _check_partitions(listed, schema) if partition_columns else ()
    ids = _summarize(schema.field(id_column).type, [ids for _, ids, _ in read]) if id_column else None
    kept = {index: table for index, (_, _, table) in enumerate(read) if table is not None}
    return InputInfo(files=tuple(files), schema=schema, num_rows=sum(f.num_rows for f in files),
                     work_unit=unit, partition_keys=keys, ids=ids, small_tables=kept)


def _summarize(id_type: pa.DataType, ids_per_file: list[pa.ChunkedArray | None]) -> IdSummary:
    return summarize_ids(pa.chunked_array([chunk for ids in ids_per_file if ids is not None for chunk in ids.chunks],
                                          type=id_type))


class _KeptBytes:
    """How many bytes of small files' rows the footer threads have kept, against MAX_KEPT_BYTES."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._num_bytes = 0

    def take(self, num_bytes: int) -> bool:
        with self._lock:
            if self._num_bytes + num_bytes > MAX_KEPT_BYTES:
                return False
            self._num_bytes += num_bytes
            return True


_Read = tuple[Footer, "pa.ChunkedArray | None", "pa.Table | None"]  # footer, ids, kept rows


def _read_footers(listed: list[ListedFile], storage_options: dict | None, id_column: str | None,
                  keep_columns: tuple[str, ...]) -> list[_Read]:
    """Footers (and id columns, and small files' kept rows) in `listed` order, fetched
    concurrently: on S3 each costs a round trip or two.

    The first unreadable file in `listed` order raises; footers not yet fetched are dropped.
    """
    kept = _KeptBytes()
    pool = ThreadPoolExecutor(max_workers=MAX_CONCURRENT_FOOTER_READS)
    try:
        return list(pool.map(lambda entry: _read_footer(entry, storage_options, id_column, keep_columns, kept),
                             listed))
    finally:
        pool.shutdown(cancel_futures=True)


def _read_footer(entry: ListedFile, storage_options: dict | None, id_column: str | None,
                 keep_columns: tuple[str, ...], kept: _KeptBytes) -> _Read:
    url = entry.url
    fs, path = resolve(url, storage_options)
    try:
        footer = read_footer(fs, path, url, entry.num_bytes, WHOLE_FILE_BYTES if keep_columns else FOOTER_GUESS_BYTES)
        if not footer.metadata.num_rows:
            return dataclasses.replace(footer, whole_file=None), None, None
        if keep_columns and footer.whole_file is not None:
            table = _read_columns(fs, path, footer, keep_columns + ((id_column,) if id_column else ()))
            if table is not None and kept.take(table.nbytes):
                ids = table.column(id_column) if id_column else None
                return dataclasses.replace(footer, whole_file=None), ids, table.select(list(keep_columns))
        ids = _read_ids(fs, path, footer, id_column) if id_column else None
        return dataclasses.replace(footer, whole_file=None), ids, None   # a small file's bytes are not kept
    except (pa.ArrowException, OSError) as error:
        raise InputError(f"{redact(url)}: not a Parquet file, or its footer is corrupt "
                         f"({describe(error, storage_options)})") from error


def _read_ids(fs, path: str, footer: Footer, id_column: str) -> pa.ChunkedArray | None:
    table = _read_columns(fs, path, footer, (id_column,))
    return table.column(0) if table is not None else None


def _read_columns(fs, path: str, footer: Footer, names: tuple[str, ...]) -> pa.Table | None:
    """Those columns of the file (each once, in that order); None when one is missing (_check_columns names it)."""
    names = tuple(dict.fromkeys(names))
    with open_parquet(fs, path, footer) as parquet_file:
        if any(parquet_file.schema_arrow.get_field_index(name) < 0 for name in names):
            return None
        return parquet_file.read(columns=list(names), use_threads=False).select(list(names))


def _arrow_schema(url: str, metadata: pq.FileMetaData) -> pa.Schema:
    try:
        return metadata.schema.to_arrow_schema()
    except (pa.ArrowException, ValueError) as error:
        raise InputError(f"{redact(url)}: its Parquet schema has no Arrow equivalent ({error})") from error


def _work_columns(columns: dict[str, str]) -> list[str]:
    """The columns whose size is a shard's work, the engine's input: the audio column, else
    every text column, summed (a score row costs its query and its document)."""
    if columns.get(AUDIO_ROLE):
        return [columns[AUDIO_ROLE]]
    return list(dict.fromkeys(columns[role] for role in TEXT_ROLES if columns.get(role)))


def _input_file(entry: ListedFile, metadata: pq.FileMetaData, num_bytes: int, work_columns: list[str],
                unit: str, read_names: set[str]) -> InputFile:
    row_groups = [metadata.row_group(i) for i in range(metadata.num_row_groups)]
    read_leaves = [i for i in range(metadata.num_columns) if metadata.schema.column(i).path.split(".")[0] in read_names]
    num_read_bytes = metadata.serialized_size + sum(group.column(i).total_compressed_size
                                                    for group in row_groups for i in read_leaves)
    # Row groups index leaf columns, not fields: a column's leaves are the one whose path
    # is its name, or those under it (a list of strings: "pair.list.element").
    leaves = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
    leaves_of = [[i for i, path in enumerate(leaves) if path == name or path.startswith(name + ".")]
                 for name in work_columns]
    work: tuple[int, ...] = ()
    if any(leaves_of):
        work = tuple(sum(estimate_work(unit, sum(group.column(i).total_uncompressed_size for i in indices))
                         for indices in leaves_of if indices) for group in row_groups)
    return InputFile(url=entry.url, num_rows=metadata.num_rows, num_row_groups=metadata.num_row_groups,
                     row_group_rows=tuple(group.num_rows for group in row_groups), row_group_work=work,
                     partition=entry.partition, num_bytes=num_bytes, num_read_bytes=num_read_bytes)


def _check_columns(url: str, schema: pa.Schema, columns: dict[str, str], carry_columns: Sequence[str],
                   check_types: bool = True) -> None:
    named = [(name, f"the {role}") for role, name in columns.items() if name is not None]
    named += [(name, "in carry_columns") for name in carry_columns]
    for name, what in named:
        if schema.get_field_index(name) < 0:
            raise InputError(f"{redact(url)}: column {name!r} ({what}) is not in the file; "
                             f"its columns are: {', '.join(schema.names)}")
    for role in TEXT_ROLES if check_types else ():
        column_type = schema.field(columns[role]).type if columns.get(role) is not None else None
        if column_type is not None and not (is_text_type(column_type) or is_messages_type(column_type)
                                            or is_pair_type(column_type)):
            raise InputError(f"{redact(url)}: column {columns[role]!r} (the {role}) has type "
                             f"{column_type}; it must hold text: {TEXT_TYPES}")


def _check_partitions(listed: list[ListedFile], schema: pa.Schema) -> tuple[str, ...]:
    """The partition keys every file shares; read_shard adds them as columns, so they must agree."""
    keys = tuple(listed[0].partition)
    for entry in listed:
        if tuple(entry.partition) != keys:
            raise InputError(f"{redact(entry.url)}: partition keys {list(entry.partition)} differ from "
                             f"{list(keys)} of {redact(listed[0].url)}")
    clashing = [key for key in keys if key in schema.names]
    if clashing:
        raise InputError(f"{redact(listed[0].url)}: partition keys {clashing} are also columns in the file")
    return keys


def _check_same_schema(url: str, first_url: str, expected: pa.Schema, actual: pa.Schema) -> None:
    difference = schema_difference(expected, actual)
    if difference:
        raise InputError(f"{redact(url)}: schema differs from {redact(first_url)}: {difference}")


def schema_difference(expected: pa.Schema, actual: pa.Schema) -> str | None:
    """What differs between two schemas by column name and type, or None.

    Field order, nullability and metadata (e.g. the pandas index) are ignored:
    rows are read by column name, and writers differ on those freely.
    """
    expected_types = {f.name: f.type for f in expected}
    actual_types = {f.name: f.type for f in actual}
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
