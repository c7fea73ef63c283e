"""A valid batch as its job's input: one Parquet file of rows under the batch's folder,
and back again (the rows' lines, custom_ids and encodings) when the output is made.

    ROOT/batches/BATCH_ID/requests.parquet   line, item, custom_id, encoding_format, input,
                                             params (the row's line's params as JSON: sampling
                                             params, or an embedding's {"dimensions": N})
    ROOT/batches/BATCH_ID/output/            the job's output (part files, manifest)

`input` is the prompt text (/v1/completions), the text to embed (/v1/embeddings), or
the chat messages as a list of {role, content} structs (/v1/chat/completions), which a
generate job renders with the model's chat template (jobs.chat).
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from api.batch_input import CHAT, PARAMS_COLUMN, BatchRequests
from api.batch_output import RequestRows
from storage.fs import join, resolve
from storage.write import table_to_parquet_bytes, write_bytes_atomic

REQUESTS_NAME = "requests.parquet"
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
    table = pa.table(columns)
    write_bytes_atomic(folder, REQUESTS_NAME, table_to_parquet_bytes(table))
    return join(folder, REQUESTS_NAME)


def read_requests(folder: str) -> RequestRows:
    fs, path = resolve(join(folder, REQUESTS_NAME))
    with fs.open(path, "rb") as file:
        table = pq.read_table(file, columns=["line", "item", "custom_id", "encoding_format"])
    lines = table.column("line").to_pylist()
    num_lines = max(lines) + 1 if lines else 0
    custom_ids, encodings = [""] * num_lines, ["float"] * num_lines
    for line, custom_id, encoding in zip(lines, table.column("custom_id").to_pylist(),
                                         table.column("encoding_format").to_pylist()):
        custom_ids[line], encodings[line] = custom_id, encoding
    return RequestRows(custom_ids=custom_ids, encodings=encodings, row_lines=lines,
                       row_items=table.column("item").to_pylist())
