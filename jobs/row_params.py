"""Per-row params: a column of the input says, row by row, how that row is computed, on
top of the job's params.

    params={"structured_column": "COL"}   generate: each row's constraint, a JSON string of
                                           the structured dict (engine.generate.structured);
                                           null = unconstrained
    params={"params_column": "COL"}       generate: each row's sampling params, a JSON object
                                           of SamplingParams fields (max_tokens, temperature,
                                           seed, stop, structured, logprobs, ...) that override
                                           the job's; embed: {"dimensions": N}, the row's own
                                           Matryoshka width; null = the job's
    params={"adapter_column": "COL"}      generate: each row's LoRA adapter, a folder path or
                                           fsspec URL as text (not JSON); null = the base
                                           model. A row's adapter is read by the worker's
                                           engine: one that cannot serve is that row's error

The OpenAI Batch API stores each request's params this way (api.batch_store), so lines
that differ in max_tokens, temperature, seed, stop or response_format run as one job
(the engine batches requests with different SamplingParams side by side), and so do
embedding lines that differ in dimensions (queueing.inference embeds each width apart).

The columns are checked at submit (present, string-typed: jobs.validate); a row whose
value is not valid JSON, or whose params the engine refuses (a schema that does not
compile, a negative max_tokens, a width the model has not), gets that as its error and
costs no engine time.
"""

from __future__ import annotations

import json

import pyarrow as pa

ROW_COLUMN_PARAMS = ("structured_column", "params_column", "adapter_column")   # job params naming a column
ADAPTER = "adapter"   # the key of a row's params under which its adapter_column value travels
# fields a params_column row may not set: they shape the job, not one request
JOB_ONLY_PARAMS = ("chat", "system_prompt", *ROW_COLUMN_PARAMS)
# what an embed row may set: its other params shape the output column's type (output_dtype)
# or the engine call (normalize, truncate, prompt), which the job's rows share
EMBED_ROW_PARAMS = ("dimensions",)


def row_columns(params: dict) -> dict[str, str]:
    """"params.<name>" -> the column it names, for the job params that name one."""
    return {f"params.{name}": params[name] for name in ROW_COLUMN_PARAMS if params.get(name) is not None}


def check_row_column_params(params: dict) -> str | None:
    """Why the row-column params are malformed (a message naming the field), or None."""
    for name in ROW_COLUMN_PARAMS:
        value = params.get(name)
        if value is not None and (not isinstance(value, str) or not value):
            return f"params.{name} must be a column name (a non-empty string), got {value!r}"
    if params.get("structured_column") is not None and params.get("structured") is not None:
        return "params.structured and params.structured_column exclude each other: one constraint for every row, " \
               "or one per row"
    return None


def row_adapters(job_adapter: str | None, overrides: list[dict] | None, num_rows: int) -> list[str | None] | None:
    """Each row's LoRA adapter: its own (params.adapter_column), else the job's (JobSpec.adapter);
    None when no row has one, so that a base model's rows name none."""
    adapters = [override.get(ADAPTER, job_adapter) for override in overrides] if overrides else [job_adapter] * num_rows
    return adapters if any(adapter is not None for adapter in adapters) else None


def shared_params(params: dict) -> dict:
    """The job's params without those naming a column: what every row starts from."""
    return {name: value for name, value in params.items() if name not in ROW_COLUMN_PARAMS}


def embed_row_error(override: dict) -> str | None:
    """Why an embed row's params cannot be used, or None. A width over the model's is
    found where the model is known (queueing.inference)."""
    others = sorted(set(override) - set(EMBED_ROW_PARAMS))
    if others:
        return f"sets {', '.join(others)}; an embed row sets only {', '.join(EMBED_ROW_PARAMS)}"
    dimensions = override.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1):
        return f"dimensions must be a positive integer or null, got {dimensions!r}"
    return None


def is_row_column_type(column_type: pa.DataType) -> bool:
    return pa.types.is_string(column_type) or pa.types.is_large_string(column_type) or pa.types.is_null(column_type)


def row_overrides(params: dict, columns: dict[str, list]) -> tuple[list[dict], dict[int, str]]:
    """Each row's params over the job's, from `columns` (column name -> its values), and
    row -> why its value cannot be used. A row without a value gets {} (the job's params)."""
    num_rows = len(next(iter(columns.values()))) if columns else 0
    overrides: list[dict] = [{} for _ in range(num_rows)]
    errors: dict[int, str] = {}
    for name, column in ((name, params.get(name)) for name in ROW_COLUMN_PARAMS):
        if column is None:
            continue
        for row, value in enumerate(columns[column]):
            if value is None or row in errors:
                continue
            parsed = _parse(name, column, value)
            if isinstance(parsed, str):
                errors[row] = parsed
            else:
                overrides[row].update(parsed)
    return overrides, errors


def _parse(name: str, column: str, value: str) -> dict | str:
    where = f"column {column!r} (params.{name})"
    if name == "adapter_column":      # a location, not JSON
        return {ADAPTER: value} if value.strip() else f"{where} is an empty string; null runs the base model"
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as error:
        return f"{where} is not valid JSON: {error.msg} at column {error.colno}"
    if name == "structured_column":
        return {"structured": parsed} if parsed is not None else {}
    if not isinstance(parsed, dict):
        return f"{where} must hold a JSON object of params, got {type(parsed).__name__}"
    refused = sorted(set(parsed) & set(JOB_ONLY_PARAMS))
    if refused:
        return f"{where} sets {', '.join(refused)}, which only a job's params can set"
    if ADAPTER in parsed:
        return f"{where} sets {ADAPTER}; a row's adapter comes from params.adapter_column"
    return parsed
