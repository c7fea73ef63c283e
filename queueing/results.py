"""Engine outputs → the output table of one shard, per mode (columns in DESIGN.md)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from jobs.validate import ROW_INDEX_FIELD

ROW_INDEX_COLUMN = ROW_INDEX_FIELD.name   # the id column added when a job names none


def build_table(mode: str, ids: pa.Array, outputs: list, *, id_column: str | None,
                embedding_dim: int) -> pa.Table:
    if mode != "embed":
        raise ValueError(f"no result table for mode {mode!r}")
    return _embed_table(ids, outputs, id_column or ROW_INDEX_COLUMN, embedding_dim)


def _embed_table(ids: pa.Array, outputs: list, id_column: str, dim: int) -> pa.Table:
    flat = np.zeros((len(outputs), dim), dtype=np.float32)
    valid = np.zeros(len(outputs), dtype=bool)
    for i, out in enumerate(outputs):
        if out.embedding is not None:
            flat[i] = out.embedding
            valid[i] = True
    values = pa.array(flat.reshape(-1), type=pa.float32())
    embeddings = pa.FixedSizeListArray.from_arrays(values, dim, mask=pa.array(~valid))
    return pa.table({
        id_column: ids,
        "embedding": embeddings,
        "num_tokens": pa.array([out.num_tokens for out in outputs], type=pa.int32()),
        "error": pa.array([out.error for out in outputs], type=pa.string()),
    })
