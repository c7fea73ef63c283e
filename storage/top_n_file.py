"""The top-N file of a score job that ranks its rows by group (params group_column and top_n).

    OUTPUT/top_n.parquet   one row per (group, rank): each group's best N rows by score
        <group column>     the group, as the input holds it; groups in the order they first appear
        rank               int32, 1 = the group's best
        <id column>        the row's id, to join back to the parts
        score              float64

It is derived from the committed parts, reading only the columns it needs of each, and
written atomically before the manifest that lists it, as errors.jsonl is
(storage.errors_file); a retried commit writes the same bytes again. Which rows are best
is decided above (queueing.top_n_output): this module reads and writes the files.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from storage.errors import OutputError
from storage.fs import describe, join, open_for_read, redact, resolve
from storage.write import PartInfo, write_part

TOP_N_NAME = "top_n.parquet"
RANK_FIELD = pa.field("rank", pa.int32())


def read_part_columns(output: str, parts: Sequence[PartInfo], schema: pa.Schema,
                      storage_options: dict | None = None) -> pa.Table:
    """The columns of `schema` of every part, in the parts' order, as one table of that schema."""
    fs, path = resolve(output, storage_options)
    tables = [schema.empty_table()]
    for part in parts:
        try:
            with open_for_read(fs, join(path, part.name)) as source, pq.ParquetFile(source) as parquet_file:
                tables.append(parquet_file.read(columns=schema.names, use_threads=False).cast(schema))
        except (pa.ArrowException, OSError) as error:
            raise OutputError(f"{redact(output)}: cannot read {', '.join(schema.names)} of {part.name} "
                              f"({describe(error, storage_options)})") from error
    return pa.concat_tables(tables)


def write_top_n_file(output: str, table: pa.Table, storage_options: dict | None = None) -> PartInfo:
    """Write `table` as OUTPUT/top_n.parquet, atomically; its PartInfo for the manifest."""
    return write_part(output, TOP_N_NAME, table, storage_options)
