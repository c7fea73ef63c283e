"""The id column over the whole input: duplicates and nulls, counted before a job runs.

A duplicate id makes the output impossible to join back one to one (OpenAI's Batch
API refuses duplicate custom_ids for the same reason), so planning reads the id
column of every file (that column only) and jobs.validate / queueing.planning
refuse the job unless it allows them. A null id is not refused here: its row
becomes an error row that names the row's position (queueing.worker).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

MAX_NAMED_DUPLICATES = 5
MAX_NAMED_ROWS = 3  # rows named for each duplicate id


@dataclass(frozen=True)
class IdSummary:
    """What the id column holds, over all files in input order."""

    num_rows: int
    num_null: int  # rows whose id is null
    num_duplicate_rows: int  # rows whose id appeared at an earlier row
    num_duplicated_ids: int  # distinct ids that appear more than once
    # the first duplicated ids, by first appearance: (id, its first input rows)
    first_duplicates: tuple[tuple[object, tuple[int, ...]], ...] = ()

    def describe_duplicates(self) -> str:
        named = "; ".join(f"{value!r} at input rows {', '.join(map(str, rows))}"
                          + (" ..." if len(rows) == MAX_NAMED_ROWS else "")
                          for value, rows in self.first_duplicates)
        more = " ..." if self.num_duplicated_ids > len(self.first_duplicates) else ""
        return (f"{self.num_duplicated_ids} ids appear more than once ({self.num_duplicate_rows} rows repeat an "
                f"earlier row's id); the first: {named}{more}")


def summarize_ids(ids: pa.Array | pa.ChunkedArray) -> IdSummary:
    """Count the nulls and the duplicates of `ids` (every file's id column, in input order)."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks() if ids.num_chunks else pa.array([], ids.type)
    if pa.types.is_dictionary(ids.type):
        ids = ids.cast(ids.type.value_type)
    counts = pc.value_counts(ids.drop_null())  # in order of first appearance
    repeated = pc.greater(counts.field("counts"), 1)
    duplicated_values = counts.field("values").filter(repeated)
    num_repeats = pc.sum(counts.field("counts").filter(repeated)).as_py() or 0
    first = []
    for value in duplicated_values[:MAX_NAMED_DUPLICATES]:
        rows = pc.indices_nonzero(pc.equal(ids, value))[:MAX_NAMED_ROWS]
        first.append((value.as_py(), tuple(rows.to_pylist())))
    return IdSummary(num_rows=len(ids), num_null=ids.null_count, num_duplicate_rows=num_repeats - len(duplicated_values),
                     num_duplicated_ids=len(duplicated_values), first_duplicates=tuple(first))
