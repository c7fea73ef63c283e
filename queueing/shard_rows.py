"""A shard's rows as the worker needs them: ids, input values, carried columns, and the
rows that cannot be computed.

A row whose id is null, or whose text is binary that is not UTF-8, is an error row:
its input goes to the engine as null (so it costs nothing and gets a null result) and
its `error` names what is wrong and where the row is in the input, since its id
cannot say which row it was.

A score job's input value is its (query, document) pair, from two columns or one column
of [query, document] lists (jobs.scoring); a null query or document is the engine's to
name, as a null text is.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from jobs.chat import chat_prompts
from jobs.records import JobRecord
from jobs.row_params import ROW_COLUMN_PARAMS, embed_row_error, row_overrides
from jobs.scoring import as_pairs, pair_columns
from jobs.spec import JobSpec
from jobs.validate import ROW_PARAMS_MODES, carried_columns, read_columns
from storage.fs import redact
from storage.plan import ShardPlan
from storage.read import read_shard
from storage.text import text_values


@dataclass
class ShardRows:
    ids: pa.Array  # every row's id (the job's id column, or the row's position in the input)
    inputs: list  # every row's input value (score: a (query, document) tuple); None for the error rows
    carried: dict  # output column name -> values copied from the input
    errors: dict[int, str]  # row in the shard -> why it cannot be computed
    row_params: list[dict] | None = None  # row -> its params over the job's (jobs.row_params); None: none


def read_rows(job: JobRecord, shard: ShardPlan) -> ShardRows:
    """The shard's ids, input values, and the columns carried into the output (carried
    columns, then partition keys)."""
    spec = job.spec
    table = pa.Table.from_batches(list(read_shard(shard, read_columns(spec), partition_columns=spec.partition_columns)))
    inputs, errors = input_values(spec, table)
    if spec.id_column:
        ids = table.column(spec.id_column).combine_chunks()
        for row in _null_rows(ids):
            errors[row] = f"the id is null; the row is {row_origin(shard, row)}"
    else:
        ids = input_positions(shard)
    row_params = _row_params(job, table, ids, errors) if spec.mode in ROW_PARAMS_MODES else None
    for row in errors:
        inputs[row] = None
    carried_names = carried_columns(spec) + (list(shard.pieces[0].partition) if spec.partition_columns else [])
    return ShardRows(ids, inputs, {name: table.column(name) for name in carried_names}, errors, row_params)


def input_values(spec: JobSpec, table: pa.Table) -> tuple[list, dict[int, str]]:
    """Each row's input value as the engine takes it, and row -> why a value cannot be read."""
    if spec.mode == "transcribe":   # audio comes as bytes or paths: only text is decoded
        return table.column(spec.input_column).to_pylist(), {}
    columns = pair_columns(spec.params) if spec.mode == "score" else None
    if columns:
        (queries, query_errors), (documents, document_errors) = (text_values(table.column(name)) for name in columns)
        return list(zip(queries, documents)), {**document_errors, **query_errors}
    inputs, errors = text_values(table.column(spec.input_column))
    if spec.mode == "generate":   # strings as chat messages when the job asks (jobs.chat)
        inputs = chat_prompts(inputs, spec.params)
    if spec.mode == "score" and not spec.params.get("chat"):   # one column of [query, document] lists
        inputs, pair_errors = as_pairs(inputs)
        errors = {**pair_errors, **errors}
    return inputs, errors


def _row_params(job: JobRecord, table: pa.Table, ids: pa.Array, errors: dict[int, str]) -> list[dict] | None:
    """Each row's params from the job's per-row columns; a row whose params are refused
    (bad JSON, a constraint that does not compile, an embed row's dimensions of 0) gets
    that as its error here, before any engine time."""
    params = job.spec.params
    names = [params[name] for name in ROW_COLUMN_PARAMS if params.get(name) is not None]
    if not names:
        return None
    overrides, refused = row_overrides(params, {name: table.column(name).to_pylist() for name in names})
    check = _generate_row_error if job.spec.mode == "generate" else _embed_row_error
    for row, override in enumerate(overrides):
        if override and row not in refused and row not in errors:
            error = check(params, ids.slice(row, 1), override)
            if error is not None:
                refused[row] = f"column {', '.join(map(repr, names))}: {error}"
    for row, error in refused.items():
        errors.setdefault(row, error)
    return [{} if row in errors else override for row, override in enumerate(overrides)]


def _generate_row_error(params: dict, row_id: pa.Array, override: dict) -> str | None:
    from queueing.inference import row_sampling_params   # imports the engine: generate workers only
    try:
        row_sampling_params(params, row_id, [override])
    except (TypeError, ValueError) as error:
        return str(error)
    return None


def _embed_row_error(params: dict, row_id: pa.Array, override: dict) -> str | None:
    return embed_row_error(override)


def input_positions(shard: ShardPlan) -> pa.Array:
    """Each row's position in the whole input (files in listing order)."""
    return pa.array([piece.global_row_start + offset for piece in shard.pieces for offset in range(piece.num_rows)],
                    type=pa.int64())


def row_origin(shard: ShardPlan, row: int) -> str:
    """Where the shard's `row` is in the input, in words."""
    for piece in shard.pieces:
        if row < piece.num_rows:
            return (f"input row {piece.global_row_start + row} "
                    f"(row {piece.row_start + row} of {redact(piece.url)})")
        row -= piece.num_rows
    raise IndexError(f"shard {shard.shard_index} has {shard.num_rows} rows, not {row}")


def with_row_errors(table: pa.Table, errors: dict[int, str]) -> pa.Table:
    """`table` (one row per shard row) with those rows' `error` set."""
    if not errors:
        return table
    values = table.column("error").to_pylist()
    for row, error in errors.items():
        values[row] = error
    index = table.schema.get_field_index("error")
    return table.set_column(index, "error", pa.array(values, type=pa.string()))


def _null_rows(ids: pa.Array) -> list[int]:
    if not ids.null_count:
        return []
    return [row for row, is_null in enumerate(ids.is_null().to_pylist()) if is_null]
