"""Engine outputs → the output table of one shard, per mode (columns in DESIGN.md)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from jobs.validate import ROW_INDEX_FIELD

ROW_INDEX_COLUMN = ROW_INDEX_FIELD.name   # the id column added when a job names none


def build_table(mode: str, ids: pa.Array, outputs: list, *, id_column: str | None, schema: pa.Schema) -> pa.Table:
    """The id and result columns; `schema` (the job's output schema) gives their types."""
    id_name = id_column or ROW_INDEX_COLUMN
    if mode == "embed":
        columns = _embed_columns(outputs, schema.field("embedding").type)
    elif mode == "generate":
        columns = _generate_columns(outputs)
        if "logprobs" in schema.names:
            columns["logprobs"] = _logprobs_column(outputs, schema.field("logprobs").type)
    elif mode == "transcribe":
        columns = _transcribe_columns(outputs, schema.field("segments").type)
    elif mode == "classify":
        columns = _classify_columns(outputs, schema.field("scores").type if "scores" in schema.names else None)
    elif mode == "score":
        columns = {"score": pa.array([out.score for out in outputs], type=pa.float64()),
                   "num_tokens": pa.array([out.num_tokens for out in outputs], type=pa.int32())}
    else:
        raise ValueError(f"no result table for mode {mode!r}")
    columns["error"] = pa.array([out.error for out in outputs], type=pa.string())
    return pa.table({id_name: ids, **columns})


def _generate_columns(outputs: list) -> dict[str, pa.Array]:
    return {
        "text": pa.array([None if out.error else out.text for out in outputs], type=pa.string()),
        "finish_reason": pa.array([out.finish_reason for out in outputs], type=pa.string()),
        "num_prompt_tokens": pa.array([out.num_prompt_tokens for out in outputs], type=pa.int32()),
        "num_output_tokens": pa.array([out.num_output_tokens for out in outputs], type=pa.int32()),
    }


def _logprobs_column(outputs: list, logprobs_type: pa.DataType) -> pa.Array:
    def entry(token) -> dict:
        return {"token_id": token.token_id, "token": token.token, "logprob": token.logprob}

    values = [None if getattr(out, "token_logprobs", None) is None else
              [{**entry(token), "top_logprobs": [entry(top) for top in token.top_logprobs]}
               for token in out.token_logprobs] for out in outputs]
    return pa.array(values, type=logprobs_type)


def _transcribe_columns(outputs: list, segments_type: pa.DataType) -> dict[str, pa.Array]:
    segments = [None if out.error else [_segment(s) for s in out.segments] for out in outputs]
    return {
        "text": pa.array([None if out.error else out.text for out in outputs], type=pa.string()),
        "segments": pa.array(segments, type=segments_type),
        "language": pa.array([out.language for out in outputs], type=pa.string()),
        "language_probability": pa.array([out.language_probability for out in outputs], type=pa.float64()),
        "duration_s": pa.array([out.duration_s for out in outputs], type=pa.float64()),
    }


def _classify_columns(outputs: list, scores_type: pa.DataType | None) -> dict[str, pa.Array]:
    """scores_type: the job asked for every label's score (params.all_scores); else None."""
    columns = {
        "label": pa.array([out.label for out in outputs], type=pa.string()),
        "score": pa.array([out.score for out in outputs], type=pa.float64()),
        "labels": pa.array([None if out.error else list(out.labels) for out in outputs], type=pa.list_(pa.string())),
    }
    if scores_type is not None:
        columns["scores"] = pa.array([None if out.scores is None else
                                      [{"label": label, "score": score} for label, score in out.scores.items()]
                                      for out in outputs], type=scores_type)
    columns["num_tokens"] = pa.array([out.num_tokens for out in outputs], type=pa.int32())
    return columns


def _segment(segment) -> dict:
    words = None if segment.words is None else [
        {"word": w.word, "start": w.start, "end": w.end, "probability": w.probability} for w in segment.words]
    return {"start": segment.start, "end": segment.end, "text": segment.text, "words": words}


def _embed_columns(outputs: list, embedding_type: pa.DataType) -> dict[str, pa.Array]:
    """A fixed-size list of the job's width, or (rows asking their own, jobs.row_params) a
    list as long as each row's vector; null for a failed row either way."""
    valid = np.array([out.embedding is not None for out in outputs], dtype=bool)
    vectors = [np.asarray(out.embedding, dtype=np.float32) for out in outputs if out.embedding is not None]
    values = pa.array(np.concatenate(vectors) if vectors else np.zeros(0, np.float32), type=pa.float32())
    if pa.types.is_fixed_size_list(embedding_type):
        # a failed row holds list_size zeros under its null
        flat = np.zeros((len(outputs), embedding_type.list_size), dtype=np.float32)
        flat[valid] = np.asarray(values).reshape(-1, embedding_type.list_size)
        embedding = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1), type=pa.float32()),
                                                      embedding_type.list_size, mask=pa.array(~valid))
    else:
        widths = np.zeros(len(outputs), dtype=np.int32)
        widths[valid] = [len(vector) for vector in vectors]
        offsets = pa.array(np.concatenate([[0], np.cumsum(widths)]).astype(np.int32))
        embedding = pa.ListArray.from_arrays(offsets, values, mask=pa.array(~valid))
    return {
        "embedding": embedding,
        "num_tokens": pa.array([out.num_tokens for out in outputs], type=pa.int32()),
    }
