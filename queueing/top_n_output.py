"""OUTPUT/top_n.parquet of a score job with params group_column and top_n: each group's
best top_n rows by score, ranked (columns in storage/top_n_file.py).

Written at the job's commit, from the committed parts in the manifest's order (input
order), before the manifest that lists it. The ranking is engine.score.top_n's pure
decision (groups in the order they first appear, equal scores in input order, error rows
never ranked), so a retried finalize reads the same parts and writes the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from engine.score.top_n import top_n
from jobs.records import JobRecord
from jobs.spec import JobSpec
from queueing.results import ROW_INDEX_COLUMN
from storage.manifest import decode_schema
from storage.top_n_file import RANK_FIELD, read_part_columns, write_top_n_file
from storage.write import PartInfo


def wants_top_n(spec: JobSpec) -> bool:
    return spec.mode == "score" and spec.params.get("top_n") is not None


def write_top_n(job: JobRecord, parts: Sequence[PartInfo]) -> PartInfo:
    """Rank the committed rows of `parts` and write OUTPUT/top_n.parquet."""
    spec = job.spec
    group, id_name = spec.params["group_column"], spec.id_column or ROW_INDEX_COLUMN
    schema = decode_schema(job.output_schema)
    read = pa.schema([schema.field(name) for name in dict.fromkeys([group, id_name, "score"])])
    table = read_part_columns(spec.output, parts, read)
    return write_top_n_file(spec.output, ranked_table(table, group, spec.params["top_n"]))


def ranked_table(table: pa.Table, group: str, n: int) -> pa.Table:
    """`table`'s best `n` rows of each group: the group column, rank (1 = best), then the
    table's other columns (the id, the score)."""
    ranked = top_n(table.column("score").to_pylist(), table.column(group).to_pylist(), n)
    rows = [row for group_rows in ranked.values() for row in group_rows]
    ranks = [rank for group_rows in ranked.values() for rank in range(1, len(group_rows) + 1)]
    best = table.take(pa.array(rows, type=pa.int64()))
    others = [name for name in table.column_names if name != group]
    return pa.table([best.column(group), pa.array(ranks, type=RANK_FIELD.type), *(best.column(name) for name in others)],
                    schema=pa.schema([table.schema.field(group), RANK_FIELD,
                                      *(table.schema.field(name) for name in others)]))
