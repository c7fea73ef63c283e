"""What a classify or score job is checked for at submit, past its spec: its params as the
engine takes them, the model's head or scorer (config.json alone:
engine.score.head_config, torch-free), and the types of the columns it reads.

    classify   a *ForSequenceClassification model; a text, pair or chat input column
    score      cross-encoder (a one-label classifier), yes/no reranker (a causal LM) or
               bi-encoder (an embedding model); pairs from two text columns or one column
               of [query, document] lists; with chat, a reward model (a one-label
               classifier) and a column of conversations; a scalar group column
"""

from __future__ import annotations

import pyarrow as pa

from jobs.models import ModelRef
from jobs.scoring import METHOD_PARAMS, classify_params, job_param_field, pair_columns, score_params
from jobs.spec import JobSpec, JobSpecError
from storage.plan import InputInfo
from storage.text import is_messages_type, is_pair_type, is_text_type


def check_classify_job(spec: JobSpec, model: ModelRef) -> None:
    from engine.score.head_config import head_config_from_hf, read_config
    _check_params(spec)
    try:
        head_config_from_hf(read_config(model.path))
    except ValueError as exc:
        raise JobSpecError("model", f"{spec.model!r} cannot classify: {exc}") from None


def check_score_job(spec: JobSpec, model: ModelRef) -> str:
    """The model's score method ("cross-encoder" | "yes-no" | "bi-encoder"), once the job fits it."""
    _check_params(spec)
    method = scorer_of(spec, model)
    for name, methods in METHOD_PARAMS.items():
        if name in spec.params and method not in methods:
            raise JobSpecError(f"params.{name}", f"applies to a {' or '.join(methods)}; {spec.model!r} is a {method}")
    return method


def scorer_of(spec: JobSpec, model: ModelRef) -> str:
    """The model's score method; JobSpecError where the job cannot score with it."""
    from engine.score.head_config import head_config_from_hf, read_config, score_method
    try:   # a Hub GGUF is not fetched at submit: it is known by its name
        method = "yes-no" if model.path.endswith(".gguf") else score_method(model.path)
        num_labels = head_config_from_hf(read_config(model.path)).num_labels if method == "cross-encoder" else None
    except ValueError as exc:
        raise JobSpecError("model", f"{spec.model!r} cannot score: {exc}") from None
    if spec.params.get("chat") and num_labels != 1:
        raise JobSpecError("params.chat", f"scoring conversations needs a reward model (a sequence classifier of one "
                                          f"label); {spec.model!r} is a {method}"
                                          + (f" of {num_labels} labels" if num_labels else ""))
    if num_labels is not None and num_labels != 1:
        raise JobSpecError("model", f"{spec.model!r} is a classifier of {num_labels} labels: it scores no pairs; "
                                    "submit it in mode 'classify', or score with a one-label cross-encoder")
    return method


def check_score_columns(spec: JobSpec, info: InputInfo) -> None:
    """The columns a score job reads have the types it reads: two text columns, a column
    of pairs, or (chat) a column of conversations; a group column of plain values."""
    columns = pair_columns(spec.params)
    for field, name in (zip(("params.query_column", "params.document_column"), columns) if columns else ()):
        _require_type(field, name, info, is_text_type, "text")
    if columns is None and spec.params.get("chat"):
        _require_type("input_column", spec.input_column, info, is_messages_type,
                      "chat messages (a list of {role, content} structs), as params.chat says")
    elif columns is None:
        _require_type("input_column", spec.input_column, info, is_pair_type,
                      "[query, document] lists of strings; or name params.query_column and params.document_column")
    group = spec.params.get("group_column")
    if group is not None and pa.types.is_nested(info.schema.field(group).type):
        raise JobSpecError("params.group_column", f"column {group!r} has type {info.schema.field(group).type}; "
                                                  "a group is a plain value (a query id, a string, a number)")


def _check_params(spec: JobSpec) -> None:
    try:
        classify_params(spec.params) if spec.mode == "classify" else score_params(spec.params)
    except ValueError as exc:
        raise JobSpecError(job_param_field(str(exc), spec.mode), str(exc)) from None


def _require_type(field: str, name: str, info: InputInfo, accepts, what: str) -> None:
    column_type = info.schema.field(name).type
    if not accepts(column_type) and not pa.types.is_null(column_type):
        raise JobSpecError(field, f"column {name!r} has type {column_type}; a score job reads {what} here")
