"""The columns of the output part files, per mode.

Every mode writes the id column first (with its input name and type), then its
result columns, then `error` (null when the row succeeded).
"""

from __future__ import annotations

import numbers

import pyarrow as pa

# A segment's words are timed only when a job asks (params.word_timestamps); else null.
WORD_TYPE = pa.struct([("word", pa.string()), ("start", pa.float64()), ("end", pa.float64()),
                       ("probability", pa.float64())])
SEGMENT_TYPE = pa.struct([("start", pa.float64()), ("end", pa.float64()), ("text", pa.string()),
                          ("words", pa.list_(WORD_TYPE))])

_RESULT_FIELDS: dict[str, list[pa.Field]] = {
    "generate": [
        pa.field("text", pa.string()),
        pa.field("finish_reason", pa.string()),  # "stop" | "length" | "abort"
        pa.field("num_prompt_tokens", pa.int32()),
        pa.field("num_output_tokens", pa.int32()),
    ],
    "transcribe": [
        pa.field("text", pa.string()),
        pa.field("segments", pa.list_(SEGMENT_TYPE)),
        pa.field("language", pa.string()),
        pa.field("language_probability", pa.float64()),   # when the language was detected, else null
        pa.field("duration_s", pa.float64()),
    ],
    "classify": [
        pa.field("label", pa.string()),          # the best label (config.json's id2label); null for a
                                                 # one-label head (regression, reward) and a failed row
        pa.field("score", pa.float64()),         # the best label's probability; a one-label head's value
        pa.field("labels", pa.list_(pa.string())),   # sigmoid: every label over the threshold, best first;
                                                     # softmax: [label]; a one-label head: []
        pa.field("num_tokens", pa.int32()),
    ],
    "score": [
        pa.field("score", pa.float64()),         # higher is more relevant
        pa.field("num_tokens", pa.int32()),      # tokens the row cost the model (a bi-encoder: both texts')
    ],
}

MODES = ("embed", "generate", "transcribe", "classify", "score")

# A classify job with params.all_scores gets every label's score, in the model's label order.
LABEL_SCORE_TYPE = pa.struct([("label", pa.string()), ("score", pa.float64())])
SCORES_FIELD = pa.field("scores", pa.list_(LABEL_SCORE_TYPE))

# A generate job that asks for logprobs (params.logprobs) gets one more column: per generated
# token its id, bytes (a piece of UTF-8, maybe not a whole character) and log-probability,
# with the `logprobs` likeliest alternatives; null for a row that did not ask.
TOP_LOGPROB_TYPE = pa.struct([("token_id", pa.int32()), ("token", pa.binary()), ("logprob", pa.float64())])
LOGPROBS_FIELD = pa.field("logprobs", pa.list_(pa.struct([
    ("token_id", pa.int32()), ("token", pa.binary()), ("logprob", pa.float64()),
    ("top_logprobs", pa.list_(TOP_LOGPROB_TYPE))])))


EMBEDDING_DTYPES = {"float32": pa.float32(), "float16": pa.float16()}


def output_schema(mode: str, id_field: pa.Field, *, dimensions: int | None = None,
                  embedding_dtype: str = "float32", dimensions_per_row: bool = False,
                  logprobs: bool = False, all_scores: bool = False) -> pa.Schema:
    """The schema of every part file of a job in `mode`.

    `id_field` is the input's id column (name and type are kept). `dimensions`
    is required for "embed": the length of each embedding vector, whose values are
    `embedding_dtype` ("float32" or "float16"); a fixed-size list, unless rows may ask
    their own width (`dimensions_per_row`, jobs.row_params): then a list as long as
    each row's. `logprobs` adds LOGPROBS_FIELD to "generate"; `all_scores` adds
    SCORES_FIELD to "classify", before num_tokens.
    """
    result_fields = _result_fields(mode, dimensions, embedding_dtype, dimensions_per_row)
    if logprobs:
        if mode != "generate":
            raise ValueError(f"logprobs applies only to generate, not to {mode!r}")
        result_fields.append(LOGPROBS_FIELD)
    if all_scores:
        if mode != "classify":
            raise ValueError(f"all_scores applies only to classify, not to {mode!r}")
        result_fields.insert(len(result_fields) - 1, SCORES_FIELD)
    fields = [id_field.remove_metadata(), *result_fields, pa.field("error", pa.string())]
    taken = {field.name for field in fields[1:]}
    if id_field.name in taken:
        raise ValueError(f"id column name {id_field.name!r} clashes with a {mode} output column; "
                         f"the output columns are {sorted(taken)}")
    return pa.schema(fields)


def _result_fields(mode: str, dimensions: int | None, embedding_dtype: str,
                   dimensions_per_row: bool) -> list[pa.Field]:
    if mode == "embed":
        if isinstance(dimensions, bool) or not isinstance(dimensions, numbers.Integral) or dimensions < 1:
            raise ValueError(f"embed needs dimensions as a positive int, got {dimensions!r}")
        if embedding_dtype not in EMBEDDING_DTYPES:
            raise ValueError(f"embedding_dtype must be one of {tuple(EMBEDDING_DTYPES)}, got {embedding_dtype!r}")
        value_type = EMBEDDING_DTYPES[embedding_dtype]
        list_type = pa.list_(value_type) if dimensions_per_row else pa.list_(value_type, int(dimensions))
        return [
            pa.field("embedding", list_type),  # null when the row failed
            pa.field("num_tokens", pa.int32()),
        ]
    if dimensions is not None or dimensions_per_row:
        raise ValueError(f"dimensions applies only to embed, not to {mode!r}")
    if mode not in _RESULT_FIELDS:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    return list(_RESULT_FIELDS[mode])
