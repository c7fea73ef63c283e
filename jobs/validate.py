"""The checks a job passes before anything is queued: the model exists, the input
files are Parquet with the named columns, the output can be written and is not
already a committed result (unless the job asks to replace it).

Only Parquet footers are read; a refused job costs no GPU time."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from jobs.adapters import check_adapter
from jobs.chat import without_chat_params
from jobs.models import ModelRef, embedding_width, model_modes, resolve_model
from jobs.row_params import ADAPTER, ROW_COLUMN_PARAMS, check_row_column_params, is_row_column_type, row_columns
from jobs.scoring import pair_columns
from jobs.scoring_checks import check_classify_job, check_score_columns, check_score_job
from jobs.settings import Settings
from jobs.spec import MODE_PARAMS, JobSpec, JobSpecError
from storage.errors import InputError, OutputError
from storage.manifest import encode_schema, is_committed
from storage.plan import InputInfo, inspect_input
from storage.schemas import output_schema
from storage.text import is_messages_type, is_pair_type
from storage.write import check_writable

ROW_INDEX_FIELD = pa.field("row_index", pa.int64())   # the id column when a job names none
ROW_PARAMS_MODES = ("generate", "embed")              # modes whose rows may carry their own params (jobs.row_params)
MESSAGES_MODES = ("generate", "classify", "score")    # modes whose input column may hold chat messages


@dataclass(frozen=True)
class CheckedJob:
    model: ModelRef
    input: InputInfo
    output_schema: pa.Schema


def check_job(spec: JobSpec, resolve: Callable[[str], ModelRef] | None = None,
              max_lora_rank: int | None = None) -> CheckedJob:
    """`resolve`: how this host names models (the client's also reads workers' cards,
    jobs.model_cards); by default, resolve_model without weights. `max_lora_rank`: the
    deployment's (Settings.max_lora_rank); by default this environment's."""
    try:
        # A Hub model's weights are the workers' to fetch.
        model = resolve(spec.model) if resolve else resolve_model(spec.model, weights=False)
    except ValueError as exc:
        raise JobSpecError("model", str(exc).removeprefix("model: ")) from None
    try:
        # Rows of small remote files are kept: jobs.inspection stages them, so no shard fetches them again.
        info = inspect_job_input(spec, summarize_ids=bool(spec.id_column), keep_columns=read_columns(spec))
    except InputError as exc:
        raise JobSpecError(_input_field(str(exc), spec), str(exc)) from None
    check_ids(spec, info)
    try:
        check_writable(spec.output)
        committed = is_committed(spec.output)
    except (OutputError, OSError, ValueError) as exc:
        raise JobSpecError("output", str(exc)) from None
    if committed and spec.if_exists == "error":
        raise JobSpecError("output", f"{spec.output} already holds a committed result (_SUCCESS); "
                                     "choose another output or submit with if_exists='replace'")
    _check_mode(spec, model)
    _check_quant_check(spec, model)
    if spec.adapter is not None:
        check_adapter(spec.adapter, model, max_lora_rank or Settings.from_env().max_lora_rank)
    if spec.mode == "transcribe":
        _check_audio_column(spec, info)
    if spec.mode == "score":
        check_score_columns(spec, info)
    _check_messages_column(spec, info)
    _check_row_columns(spec, info)
    id_field = info.schema.field(spec.id_column) if spec.id_column else ROW_INDEX_FIELD
    # Outside the try: a JobSpecError is a ValueError, and its field must not become id_column's.
    dimensions = _dimensions(spec, model)
    try:
        embedding = {"embedding_dtype": spec.params.get("output_dtype", "float32"),
                     "dimensions_per_row": spec.params.get("params_column") is not None} if spec.mode == "embed" else {}
        logprobs = {"logprobs": spec.params.get("logprobs") is not None} if spec.mode == "generate" else {}
        scores = {"all_scores": spec.params.get("all_scores", False)} if spec.mode == "classify" else {}
        schema = output_schema(spec.mode, id_field, dimensions=dimensions, **embedding, **logprobs, **scores)
    except ValueError as exc:
        raise JobSpecError("id_column", str(exc)) from None
    return CheckedJob(model=model, input=info, output_schema=_with_carried(schema, spec, info))


def inspect_job_input(spec: JobSpec, *, summarize_ids: bool = False, keep_columns: list[str] = ()) -> InputInfo:
    """The input's footers, checked for every column the job reads (storage.inspect_input);
    with `summarize_ids`, the id column's nulls and duplicates counted too; with
    `keep_columns`, small remote files' rows kept (InputInfo.small_tables)."""
    return inspect_input(spec.inputs, columns=input_columns(spec), carry_columns=spec.carry_columns,
                         partition_columns=spec.partition_columns, summarize_ids=summarize_ids,
                         keep_columns=keep_columns)


def check_ids(spec: JobSpec, info: InputInfo) -> None:
    """Duplicate ids refuse the job unless it allows them (its output could not be joined back)."""
    if info.ids is None or not info.ids.num_duplicate_rows or spec.allow_duplicate_ids:
        return
    raise JobSpecError("id_column", f"column {spec.id_column!r}: {info.ids.describe_duplicates()}; "
                                    "submit with allow_duplicate_ids=True to run the job anyway")


def read_columns(spec: JobSpec) -> list[str]:
    """The input columns a shard reads, in order: the input (a score job's query and
    document columns), the id, the carried columns, the columns of per-row params
    (jobs.row_params)."""
    named = value_columns(spec) + ([spec.id_column] if spec.id_column else []) + carried_columns(spec)
    return list(dict.fromkeys(named + list(_row_columns(spec).values())))


def value_columns(spec: JobSpec) -> list[str]:
    """The columns whose values the engine takes: the input column, or a score job's two."""
    columns = pair_columns(spec.params) if spec.mode == "score" else None
    return list(columns) if columns else [spec.input_column]


def carried_columns(spec: JobSpec) -> list[str]:
    """The input columns copied into the output: carry_columns, then a score job's group
    column (top_n.parquet ranks the output's rows by it) unless it is carried or the id."""
    group = spec.params.get("group_column") if spec.mode == "score" else None
    extra = [group] if group is not None and group not in spec.carry_columns and group != spec.id_column else []
    return list(spec.carry_columns) + extra


def carried_fields(spec: JobSpec, info: InputInfo) -> list[pa.Field]:
    """The input columns a job copies into its output, in order: carried, then partition keys."""
    fields = [info.schema.field(name).remove_metadata() for name in carried_columns(spec)]
    if spec.partition_columns and info.files:
        fields += [pa.field(key, pa.string()) for key in info.files[0].partition]
    return fields


def _with_carried(schema: pa.Schema, spec: JobSpec, info: InputInfo) -> pa.Schema:
    carried = carried_fields(spec, info)
    clashes = sorted({f.name for f in carried} & set(schema.names))
    if clashes:
        field = "carry_columns" if set(clashes) & set(spec.carry_columns) else "params.group_column"
        raise JobSpecError(field, f"{', '.join(clashes)} would clash with an output column of the same "
                                            f"name; the output columns are {', '.join(schema.names)}")
    return pa.schema([schema.field(0), *carried, *list(schema)[1:]])


def input_columns(spec: JobSpec) -> dict[str, str]:
    """role -> column name, for storage.plan.inspect_input (audio is not text: its own role;
    a score job's query and document columns are text of their own roles)."""
    pairs = pair_columns(spec.params) if spec.mode == "score" else None
    if pairs:
        columns = {"params.query_column": pairs[0], "params.document_column": pairs[1]}
    else:
        columns = {"audio_column" if spec.mode == "transcribe" else "input_column": spec.input_column}
    if spec.id_column:
        columns["id_column"] = spec.id_column
    if spec.mode == "score" and spec.params.get("group_column") is not None:
        columns["params.group_column"] = spec.params["group_column"]
    return {**columns, **_row_columns(spec)}


def _row_columns(spec: JobSpec) -> dict[str, str]:
    return row_columns(spec.params) if spec.mode in ROW_PARAMS_MODES else {}


def encoded_schema(checked: CheckedJob) -> str:
    return encode_schema(checked.output_schema)


def _check_mode(spec: JobSpec, model: ModelRef) -> None:
    if spec.mode == "classify":     # these two name what the model lacks: a head, a way to score pairs
        check_classify_job(spec, model)
    elif spec.mode == "score":
        check_score_job(spec, model)
    serves = model_modes(model.path)
    if spec.mode not in serves:
        raise JobSpecError("model", f"{spec.model!r} is a model for {' and '.join(map(repr, serves))}, "
                                    f"not for mode {spec.mode!r}")
    malformed = check_row_column_params(spec.params) if spec.mode in ROW_PARAMS_MODES else None
    if malformed:
        raise JobSpecError(malformed.split(" ", 1)[0], malformed)
    if spec.mode == "generate":
        from engine.generate.sampling_params import SamplingParams   # imports torch: only here
        try:
            SamplingParams(**sampling_kwargs(spec.params))
        except (TypeError, ValueError) as exc:
            # SamplingParams' messages start with the field's name ("structured.regex does not compile")
            name = str(exc).split(" ", 1)[0].split(".", 1)[0]
            field = f"params.{name}" if name in MODE_PARAMS["generate"] else "params"
            raise JobSpecError(field, str(exc)) from None
    if spec.mode == "embed" and (spec.params.get("prompt") is not None or spec.params.get("prompt_name") is not None):
        _check_prompt(spec, model)
    if spec.mode == "transcribe":
        from engine.whisper.params import TranscribeParams
        try:
            TranscribeParams(**spec.params)
        except ValueError as exc:
            name = str(exc).split(" ", 1)[0]     # TranscribeParams' messages start with the field's name
            field = f"params.{name}" if name in TranscribeParams.__dataclass_fields__ else "params"
            raise JobSpecError(field, str(exc)) from None


def _check_quant_check(spec: JobSpec, model: ModelRef) -> None:
    """A checkpoint that is FP8 already loads as FP8 whatever is asked (engine.quant), so
    there would be no unquantized model to compare with: the figures would mean nothing."""
    config = Path(model.path, "config.json")
    if not spec.quant_check_rows or not config.is_file():
        return
    if json.loads(config.read_text()).get("quantization_config"):
        raise JobSpecError("quant_check_rows", f"{spec.model!r} is an FP8 checkpoint already: there is no "
                                               "unquantized model on this worker to compare it with")


def _check_prompt(spec: JobSpec, model: ModelRef) -> None:
    """A prompt_name the model does not define, or a prompt its pooling would leave out, is
    refused here rather than failing every shard."""
    from engine.embed.config import load_encoder_config   # imports torch: only here
    try:
        config = load_encoder_config(model.path)
    except (OSError, ValueError) as exc:
        raise JobSpecError("model", str(exc)) from None
    field = "params.prompt_name" if spec.params.get("prompt_name") is not None else "params.prompt"
    try:
        config.prompt_for(spec.params.get("prompt"), spec.params.get("prompt_name"))
    except ValueError as exc:
        raise JobSpecError(field, str(exc)) from None


def _check_audio_column(spec: JobSpec, info: InputInfo) -> None:
    """Audio comes as bytes (binary) or as paths/URLs of audio files (string)."""
    column_type = info.schema.field(spec.input_column).type
    if not any(check(column_type) for check in (pa.types.is_binary, pa.types.is_large_binary,
                                                 pa.types.is_string, pa.types.is_large_string)):
        raise JobSpecError("input_column", f"column {spec.input_column!r} has type {column_type}; a transcribe "
                                           "job needs audio bytes (binary) or audio file paths/URLs (string)")


def _check_row_columns(spec: JobSpec, info: InputInfo) -> None:
    """A per-row params column holds JSON text (jobs.row_params); its rows are checked as read."""
    for field_name, column in _row_columns(spec).items():
        column_type = info.schema.field(column).type
        if not is_row_column_type(column_type):
            holds = ("adapter locations (a string column, null for the base model)"
                     if field_name == "params.adapter_column" else "JSON text (a string column, null for the job's params)")
            raise JobSpecError(field_name, f"column {column!r} has type {column_type}; it must hold {holds}")
        if spec.incremental:
            raise JobSpecError(field_name, "an incremental job keys its cache on the input text alone, so it "
                                           "cannot take per-row params yet; submit without incremental")


def _check_messages_column(spec: JobSpec, info: InputInfo) -> None:
    """Chat messages are prompts (a generate job renders them, jobs.chat) or conversations
    (a classify or score job's reward model scores them); pairs are a classify or score job's."""
    field = info.schema.field(spec.input_column) if spec.input_column in info.schema.names else None
    if spec.mode not in MESSAGES_MODES and field is not None and is_messages_type(field.type):
        raise JobSpecError("input_column", f"column {spec.input_column!r} holds chat messages ({field.type}); "
                                           f"only generate, classify and score jobs take messages, a {spec.mode} "
                                           "job needs text")
    if spec.mode not in ("classify", "score") and field is not None and is_pair_type(field.type):
        raise JobSpecError("input_column", f"column {spec.input_column!r} holds lists of strings ({field.type}); "
                                           f"only classify and score jobs take pairs, a {spec.mode} job needs text")


def sampling_kwargs(params: dict) -> dict:
    """A generate job's params as engine.SamplingParams keywords (lists become tuples; the
    chat params shape the prompt instead, jobs.chat; a row's adapter is not a sampling param)."""
    return {name: tuple(value) if isinstance(value, list) else value
            for name, value in without_chat_params(params).items() if name not in (*ROW_COLUMN_PARAMS, ADAPTER)}


def _input_field(message: str, spec: JobSpec) -> str:
    # Name the field the user must change: a missing or mistyped column is that field's.
    if "(the input_column)" in message or "(the audio_column)" in message:
        return "input_column"
    if "(the id_column)" in message:
        return "id_column"
    if "(in carry_columns)" in message:
        return "carry_columns"
    for name in (*ROW_COLUMN_PARAMS, "query_column", "document_column", "group_column"):
        if f"(the params.{name})" in message:
            return f"params.{name}"
    return "input"


def _dimensions(spec: JobSpec, model: ModelRef) -> int | None:
    if spec.mode != "embed":
        return None
    hidden_size = embedding_width(model.path)
    dimensions = spec.params.get("dimensions")
    if dimensions is not None and hidden_size is not None and dimensions > hidden_size:
        raise JobSpecError("params.dimensions", f"{dimensions} is larger than the model's {hidden_size} dimensions")
    if dimensions is None and hidden_size is None:
        raise JobSpecError("params.dimensions", "the model's config.json has no hidden_size; set params.dimensions")
    return dimensions or hidden_size
