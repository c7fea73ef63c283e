"""What a structured generate job's manifest adds to its stats: the rows that ended at
max_tokens (finish_reason "length") under the job's constraint. Their text is an
incomplete document (a JSON object cut off, a regex not yet matched), so a user who
parses the results needs the count before reading them. A job whose constraints come
from a column (params.structured_column) counts every row that ended at max_tokens: its
output does not say which rows had a constraint.

Counted from the committed parts' `finish_reason` column, one column of one part at a
time, as the errors file is derived from their `error` column."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from storage.errors import OutputError
from storage.fs import describe, join, open_for_read, redact, resolve
from storage.write import PartInfo


def structured_stats(spec, parts: Sequence[PartInfo]) -> dict:
    """{"structured": {"rows_length": N}} for a generate job with params.structured or
    params.structured_column; else {}."""
    if spec.mode != "generate" or not (spec.params.get("structured") or spec.params.get("structured_column")):
        return {}
    return {"structured": {"rows_length": sum(_num_length_rows(spec.output, part) for part in parts)}}


def _num_length_rows(output: str, part: PartInfo) -> int:
    fs, path = resolve(output)
    try:
        with open_for_read(fs, join(path, part.name)) as source, pq.ParquetFile(source) as parquet_file:
            return sum(pc.sum(pc.equal(batch.column(0), "length")).as_py() or 0
                       for batch in parquet_file.iter_batches(columns=["finish_reason"], use_threads=False))
    except (pa.ArrowException, OSError) as error:
        raise OutputError(f"{redact(output)}: cannot read the finish reasons of {part.name} "
                          f"({describe(error)})") from error
