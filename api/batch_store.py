"""A valid batch as its job's input: one Parquet file of rows under the batch's folder,
and back again (the rows' lines, custom_ids and encodings) when the output is made.

    ROOT/batches/BATCH_ID/requests.parquet   line, item, custom_id, encoding_format, input,
                                             params (the row's line's params as JSON: sampling
                                             params, or an embedding's {"dimensions": N});
                                             rerank and score: document, top_n, return_documents;
                                             lines naming LoRA adapters: model (the line's, as
                                             it named it), adapter (its location, null: base)
    ROOT/batches/BATCH_ID/output/            the job's output (part files, manifest)

`input` is the prompt text (/v1/completions), the text to embed (/v1/embeddings), or
the chat messages as a list of {role, content} structs (/v1/chat/completions), which a
generate job renders with the model's chat template (jobs.chat), or a pair's query
(/v1/rerank, /v1/score: `query` or `text_1`), scored against its `document` (`documents[i]`
or `text_2`); a rerank line's `top_n` and `return_documents` are repeated on each of its
rows, for the output to read back, as is a line's `model` when lines name adapters
(api.batch_adapters): the job's adapter column is `adapter`.
"""

from __future__ import annotations

import dataclasses
import json

import pyarrow as pa
import pyarrow.parquet as pq

from api.batch_adapters import ADAPTER_COLUMN
from api.batch_input import CHAT, DOCUMENT_COLUMN, PARAMS_COLUMN, SCORE_ENDPOINTS, BatchRequests
from api.batch_output import RequestRows
from storage.fs import join, resolve
from storage.write import table_to_parquet_bytes, write_bytes_atomic

REQUESTS_NAME = "requests.parquet"
LINE_COLUMNS = ("line", "item", "custom_id", "encoding_format")
SCORE_COLUMNS = (DOCUMENT_COLUMN, "top_n", "return_documents")   # a rerank or score batch's only
MODEL_COLUMN = "model"   # each row's line's model, in a batch whose lines name adapters only
MESSAGES_TYPE = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


def batch_folder(root_url: str, batch_id: str) -> str:
    return join(join(root_url, "batches"), batch_id)


def write_requests(folder: str, batch: BatchRequests) -> str:
    """The requests' Parquet file (one row group per 2,048 rows); its URL."""
    input_type = MESSAGES_TYPE if batch.endpoint == CHAT else pa.string()
    columns = {
        "line": pa.array(batch.row_lines, pa.int32()),
        "item": pa.array(batch.row_items, pa.int32()),
        "custom_id": pa.array([batch.custom_ids[line] for line in batch.row_lines], pa.string()),
        "encoding_format": pa.array([batch.encodings[line] for line in batch.row_lines], pa.string()),
        "input": pa.array(batch.row_inputs, input_type),
        PARAMS_COLUMN: pa.array([json.dumps(params, ensure_ascii=False) for params in batch.row_params], pa.string()),
    }
    if batch.endpoint in SCORE_ENDPOINTS:
        columns[DOCUMENT_COLUMN] = pa.array(batch.row_documents, pa.string())
        columns["top_n"] = pa.array([batch.top_ns[line] for line in batch.row_lines], pa.int32())
        columns["return_documents"] = pa.array([batch.return_documents[line] for line in batch.row_lines], pa.bool_())
    if batch.params.get("adapter_column") is not None:
        columns[MODEL_COLUMN] = pa.array([batch.line_models[line] for line in batch.row_lines], pa.string())
        columns[ADAPTER_COLUMN] = pa.array(batch.row_adapters, pa.string())
    table = pa.table(columns)
    write_bytes_atomic(folder, REQUESTS_NAME, table_to_parquet_bytes(table))
    return join(folder, REQUESTS_NAME)


def read_requests(folder: str) -> RequestRows:
    fs, path = resolve(join(folder, REQUESTS_NAME))
    with fs.open(path, "rb") as file:
        parquet = pq.ParquetFile(file)
        is_score = DOCUMENT_COLUMN in parquet.schema_arrow.names
        has_models = MODEL_COLUMN in parquet.schema_arrow.names
        table = parquet.read(columns=[*LINE_COLUMNS, *(SCORE_COLUMNS if is_score else ()),
                                      *((MODEL_COLUMN,) if has_models else ())])
    lines = table.column("line").to_pylist()
    num_lines = max(lines) + 1 if lines else 0
    custom_ids, encodings = [""] * num_lines, ["float"] * num_lines
    for line, custom_id, encoding in zip(lines, table.column("custom_id").to_pylist(),
                                         table.column("encoding_format").to_pylist()):
        custom_ids[line], encodings[line] = custom_id, encoding
    requests = RequestRows(custom_ids=custom_ids, encodings=encodings, row_lines=lines,
                           row_items=table.column("item").to_pylist(),
                           line_models=_line_models(lines, table, num_lines) if has_models else [])
    return _with_pairs(requests, table) if is_score else requests


def _line_models(lines: list[int], table: pa.Table, num_lines: int) -> list[str]:
    models = [""] * num_lines
    for line, model in zip(lines, table.column(MODEL_COLUMN).to_pylist()):
        models[line] = model
    return models


def _with_pairs(requests: RequestRows, table: pa.Table) -> RequestRows:
    """A score batch's per-line top_n and return_documents, and its rows' documents."""
    num_lines = len(requests.custom_ids)
    top_ns: list[int | None] = [None] * num_lines
    return_documents = [False] * num_lines
    for line, top_n, returned in zip(requests.row_lines, table.column("top_n").to_pylist(),
                                     table.column("return_documents").to_pylist()):
        top_ns[line], return_documents[line] = top_n, returned
    return dataclasses.replace(requests, top_ns=top_ns, return_documents=return_documents,
                               row_documents=table.column(DOCUMENT_COLUMN).to_pylist())
