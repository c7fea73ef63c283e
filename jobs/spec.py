"""JobSpec: what a user asks Barge to do, validated at the boundary.

Everything that can be checked without touching data is checked here, in one place,
and each problem is reported as a `JobSpecError` naming the field. Checks that need
the data (input files exist and have the columns, the output can be written) run in
`jobs.validate` before anything is queued.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from jobs.scoring import params_problem
from webhooks.events import OPT_IN_EVENT_TYPES
from webhooks.safety import validate_webhook_url

MODES = ("embed", "generate", "transcribe", "classify", "score")
# Modes whose engine this version of Barge has; a job in another mode is refused.
AVAILABLE_MODES = ("embed", "generate", "transcribe", "classify", "score")
# Modes that take no quantization: their FP8 quality check (quant_check_rows) is not built yet.
UNQUANTIZED_MODES = ("classify", "score")
IF_EXISTS = ("error", "replace")
# engine.quant.config.QUANTIZATIONS, without importing torch at submission
QUANTIZATIONS = (None, "fp8", "fp8-block", "fp8-group")
# engine.engine.DTYPES; None: the engine's default (float32 on CPU, 16-bit on a GPU)
DTYPES = (None, "float32", "bfloat16", "float16")
# engine.generate.options.KV_CACHE_DTYPES; None and "auto" alike: the model's dtype
KV_CACHE_DTYPES = (None, "auto", "fp8")
# engine.generate.structured.WHITESPACES, without importing the engine at submission
STRUCTURED_WHITESPACES = ("compact", "any")

# mode -> parameter name -> (accepted types, description for errors)
MODE_PARAMS: dict[str, dict[str, tuple[tuple[type, ...], str]]] = {
    "embed": {
        "normalize": ((bool,), "a boolean"),
        "dimensions": ((int, type(None)), "a positive integer or null"),
        "truncate": ((bool,), "a boolean (false: refuse texts longer than the model's max_seq_length)"),
        "output_dtype": ((str,), '"float32" or "float16"'),
        # sentence-transformers' encode(prompt=, prompt_name=): text put before every row
        "prompt": ((str, type(None)), 'a string put before every text (e.g. "Instruct: ...\\nQuery:"), or null'),
        "prompt_name": ((str, type(None)), "the name of one of the model's prompts, or null"),
        # jobs.row_params: a string column whose rows hold JSON, each row's own {"dimensions": N}
        "params_column": ((str, type(None)), "the name of a column of each row's params as JSON "
                                             "({\"dimensions\": N}), or null"),
    },
    # engine.SamplingParams; a row's seed is derived from `seed` and its id (queueing.inference)
    "generate": {
        "max_tokens": ((int,), "a positive integer"),
        "temperature": ((int, float), "a number >= 0 (0: greedy)"),
        "top_k": ((int, type(None)), "a positive integer or null"),
        "top_p": ((int, float), "a number in (0, 1]"),
        "seed": ((int, type(None)), "an integer or null"),
        "stop": ((list, tuple), "a list of strings"),
        "stop_token_ids": ((list, tuple), "a list of token ids"),
        "ignore_eos": ((bool,), "a boolean"),
        # per generated token its log-probability and the N likeliest (an output column, storage.schemas)
        "logprobs": ((int, type(None)), "an integer N >= 0 (the N likeliest alternatives too), or null"),
        # engine.generate.structured: every row's text follows it; checked at submit (jobs.validate)
        "structured": ((dict, type(None)), "a dict with one of json_schema, json_object, regex, choice, grammar; or null"),
        # a JSON constraint's whitespace: "compact" (the default: one line, as json.dumps writes it) or "any"
        "structured_whitespace": ((str,), '"compact" or "any"'),
        # append the tokens a constraint forces without a forward step each: fewer steps, but
        # greedy text can differ from transformers' and vLLM's (engine.generate.llm_engine)
        "jump_forward": ((bool, type(None)), "a boolean (true: jump forward under a constraint), or null"),
        # jobs.chat: strings become a user message (after system_prompt), rendered with the
        # model's chat template; a column of chat messages is rendered whatever these say
        "chat": ((bool,), "a boolean (true: render each string as a user message with the chat template)"),
        "system_prompt": ((str, type(None)), "a string sent as the system message before each row, or null"),
        # jobs.row_params: a string column whose rows hold JSON, each row's own params over these
        "structured_column": ((str, type(None)), "the name of a column of each row's structured dict as JSON, or null"),
        "params_column": ((str, type(None)), "the name of a column of each row's sampling params as JSON, or null"),
        # jobs.row_params: a string column of each row's LoRA adapter (folder or URL); null: the base model
        "adapter_column": ((str, type(None)), "the name of a column of each row's LoRA adapter (a folder path or "
                                              "URL; null: the base model), or null"),
    },
    # engine.whisper.TranscribeParams; values are checked there too (jobs.validate)
    "transcribe": {
        "language": ((str, type(None)), "a language code such as \"en\", or null to detect it"),
        "task": ((str,), '"transcribe" or "translate"'),
        "temperature": ((int, float, list, tuple), "a number in [0, 2] or a list of them (fallbacks)"),
        "beam_size": ((int,), "an integer from 1 (greedy) to 16 (beam search)"),
        "vad": ((bool,), "a boolean (false: cut only to fit 30 s, keep silences)"),
        "word_timestamps": ((bool,), "a boolean (true: each segment's words with start, end and probability)"),
        "long_form": ((str,), '"vad" (windows cut at pauses, decoded together) or "sequential" (each window '
                              'conditioned on the text before it, as openai-whisper)'),
    },
    # engine.score.ClassifyParams (all_scores is its return_all_scores); values are checked there too
    "classify": {
        "truncate": ((bool,), "a boolean (false: refuse texts longer than the model's max_seq_length)"),
        "activation": ((str,), '"auto" (the config\'s problem_type decides), "softmax", "sigmoid" or "none"'),
        "threshold": ((int, float), "a number in [0, 1] (sigmoid: the labels whose score reaches it)"),
        "all_scores": ((bool,), "a boolean (true: every label's score, in a scores column)"),
    },
    # engine.score.ScoreParams, and the job's own (jobs.scoring.SCORE_JOB_PARAMS)
    "score": {
        "query_column": ((str, type(None)), "the name of the queries' column, or null (input_column holds pairs)"),
        "document_column": ((str, type(None)), "the name of the documents' column, or null"),
        "chat": ((bool,), "a boolean (true: input_column holds conversations, scored by a reward model)"),
        "group_column": ((str, type(None)), "the name of the column grouping rows for top_n (e.g. a query id)"),
        "top_n": ((int, type(None)), "a positive integer: top_n.parquet holds each group's best top_n rows"),
        "truncate": ((bool,), "a boolean (false: refuse pairs longer than the model takes)"),
        "activation": ((str,), '"auto", "sigmoid" or "none" (a cross-encoder\'s score)'),
        "instruction": ((str, type(None)), "the yes/no reranker's task, or null for its default"),
        "yes_token": ((str,), "the token whose probability is a yes/no reranker's score"),
        "no_token": ((str,), "the token a yes/no reranker weighs yes_token against"),
        "group_by_query": ((bool,), "a boolean (a yes/no reranker: a query's pairs run together)"),
    },
}



class JobSpecError(ValueError):
    """A JobSpec (or its data) that Barge refuses; `field` names the culprit."""

    def __init__(self, field: str, problem: str):
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


@dataclass(frozen=True)
class JobSpec:
    """One batch job. Frozen: a job's spec never changes after submission."""

    mode: str
    """"embed", "generate", "transcribe", "classify" or "score"."""
    model: str
    """A registered model name or a model folder path (see `jobs.models`)."""
    input: str | tuple[str, ...]
    """Parquet input: a path or fsspec URL, a glob, a directory, or several of these."""
    output: str
    """Output folder (path or fsspec URL): part files, `_manifest.json`, `_SUCCESS`."""
    input_column: str = "text"
    """The column holding each row's input (transcribe: audio bytes, or paths/URLs of audio files;
    score: [query, document] lists unless params name a query and a document column)."""
    id_column: str | None = None
    """A column carried into the output to join results back; None adds `row_index`."""
    webhook_url: str | None = None
    """Where the job's final event is POSTed (Standard Webhooks signed)."""
    params: dict[str, Any] = field(default_factory=dict)
    """Mode parameters, e.g. {"normalize": True, "dimensions": 256} for embed."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Free-form, JSON-serialisable; echoed in status and in the webhook payload."""
    if_exists: str = "error"
    """What to do when `output` already holds a committed result: "error" or "replace"."""
    max_rows_per_shard: int = 2048
    """Upper bound on a shard's rows; shards follow Parquet row-group boundaries."""
    webhook_events: tuple[str, ...] = ()
    """Opt-in events besides the final one: "job.progress" (every tenth of the shards)
    and/or "shard.completed" (every shard). Needs `webhook_url`."""
    expires_after_s: float | None = None
    """Seconds after submission after which an unfinished job stops and is `expired`."""
    carry_columns: tuple[str, ...] = ()
    """Input columns copied unchanged into the output, after the id column."""
    partition_columns: bool = False
    """Copy a hive-partitioned input's keys (`year=2026/...`) into the output as string columns."""
    max_tokens_per_shard: int | None = 1_000_000
    """Upper bound on a shard's estimated work (tokens, from Parquet footers), besides its rows."""
    max_audio_seconds_per_shard: int | None = 1800
    """Transcribe: upper bound on a shard's audio seconds, besides its rows; each file's duration
    is read from its container header at planning (storage.durations)."""
    errors_file: bool = True
    """Write OUTPUT/errors.jsonl listing each failed row's id and error (when any row failed)."""
    priority: int = 5
    """0 (lowest) to 9 (highest): the broker hands a higher-priority job's shards to
    workers first (RabbitMQ and Redis; the embedded broker is first in, first out)."""
    incremental: bool = False
    """Reuse results cached by earlier jobs for input values seen before (same model
    revision, mode and params); only new and changed rows reach the engine."""
    quantization: str | None = None
    """None (the model's own 16/32-bit weights), "fp8" (E4M3 weights, one scale per output
    channel), "fp8-block" (128x128 block scales) or "fp8-group" (one scale per row and 128
    input columns): linear layers run in FP8 (engine.quant).
    Transcription stays 16-bit unless a job asks."""
    dtype: str | None = None
    """Embed only: None (the worker's default: float32 on CPU, the model's 16-bit type on a
    GPU), "float32", "bfloat16" (on CPU, oneDNN's AMX kernels: a worker whose CPU lacks them
    fails the shard saying so) or "float16"."""
    kv_cache_dtype: str | None = None
    """Generate only: None or "auto" (K/V cached in the model's dtype) or "fp8" (E4M3 with a
    scale per token and kv head: about twice the sequences in the same memory, on a GPU of
    compute capability 8.9 or later; engine/generate/kv_cache.py). "auto" is stored as None."""
    quant_check_rows: int = 0
    """With quantization: the first this many rows of shard 0 also run through the model
    unquantized, and the comparison is stored with the job (`barge report`, manifest)."""
    allow_duplicate_ids: bool = False
    """Run a job whose id column repeats ids; by default planning refuses it, naming the first."""
    adapter: str | None = None
    """Generate only: a PEFT LoRA adapter (a folder path or fsspec URL holding adapter_config.json
    and adapter_model.safetensors, or a Hub id, `org/name[@revision]` or `hf://...`, as a model's)
    on the model, for every row; checked at submit (jobs.adapters), which stores a Hub id pinned to
    its commit, `hf://org/name@<commit>`. Per row instead: params={"adapter_column": COL}."""

    def __post_init__(self) -> None:
        if isinstance(self.input, list):
            object.__setattr__(self, "input", tuple(self.input))
        if isinstance(self.carry_columns, (list, str)):
            object.__setattr__(self, "carry_columns", tuple([self.carry_columns] if isinstance(self.carry_columns, str)
                                                            else self.carry_columns))
        if isinstance(self.webhook_events, list):
            object.__setattr__(self, "webhook_events", tuple(self.webhook_events))
        object.__setattr__(self, "params", dict(self.params))
        object.__setattr__(self, "metadata", dict(self.metadata))
        if self.kv_cache_dtype == "auto":     # one spelling of the default: engine keys and cache namespaces
            object.__setattr__(self, "kv_cache_dtype", None)
        self._validate()

    def _validate(self) -> None:
        if self.mode not in MODES:
            raise JobSpecError("mode", f"unknown mode {self.mode!r}; expected one of {', '.join(MODES)}")
        if self.mode not in AVAILABLE_MODES:
            raise JobSpecError("mode", f"{self.mode!r} is not available in this version of Barge "
                                       f"(available: {', '.join(AVAILABLE_MODES)})")
        _require_text("model", self.model)
        inputs = (self.input,) if isinstance(self.input, str) else self.input
        if not inputs:
            raise JobSpecError("input", "no input given")
        for url in inputs:
            _require_text("input", url)
        _require_text("output", self.output)
        _require_text("input_column", self.input_column)
        if self.id_column is not None:
            _require_text("id_column", self.id_column)
        if self.webhook_url is not None:
            try:
                validate_webhook_url(self.webhook_url)
            except ValueError as exc:
                raise JobSpecError("webhook_url", str(exc).removeprefix("webhook_url: ")) from None
        if self.if_exists not in IF_EXISTS:
            raise JobSpecError("if_exists", f"{self.if_exists!r} is not one of {', '.join(IF_EXISTS)}")
        # bool is an int subclass: True must not pass for 1.
        if (isinstance(self.max_rows_per_shard, bool) or not isinstance(self.max_rows_per_shard, int)
                or self.max_rows_per_shard < 1):
            raise JobSpecError("max_rows_per_shard", f"must be a positive integer, got {self.max_rows_per_shard!r}")
        for name in self.carry_columns:
            _require_text("carry_columns", name)
        if self.max_tokens_per_shard is not None and (isinstance(self.max_tokens_per_shard, bool) or not isinstance(
                self.max_tokens_per_shard, int) or self.max_tokens_per_shard < 1):
            raise JobSpecError("max_tokens_per_shard", f"must be a positive integer or null, got {self.max_tokens_per_shard!r}")
        if self.max_audio_seconds_per_shard is not None and (
                isinstance(self.max_audio_seconds_per_shard, bool) or not isinstance(self.max_audio_seconds_per_shard, int)
                or self.max_audio_seconds_per_shard < 1):
            raise JobSpecError("max_audio_seconds_per_shard",
                               f"must be a positive integer or null, got {self.max_audio_seconds_per_shard!r}")
        for name in ("incremental", "allow_duplicate_ids"):
            if not isinstance(getattr(self, name), bool):
                raise JobSpecError(name, f"must be a boolean, got {getattr(self, name)!r}")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int) or not 0 <= self.priority <= 9:
            raise JobSpecError("priority", f"must be an integer from 0 (lowest) to 9 (highest), got {self.priority!r}")
        self._validate_quantization()
        self._validate_dtype()
        self._validate_kv_cache_dtype()
        self._validate_params()
        self._validate_adapter()
        self._validate_webhook_events()
        if self.expires_after_s is not None and (
                isinstance(self.expires_after_s, bool) or not isinstance(self.expires_after_s, (int, float))
                or not self.expires_after_s > 0):
            raise JobSpecError("expires_after_s", f"must be a positive number of seconds, got {self.expires_after_s!r}")

    def _validate_quantization(self) -> None:
        if self.quantization not in QUANTIZATIONS:
            expected = ", ".join(repr(q) for q in QUANTIZATIONS if q) + " or null"
            raise JobSpecError("quantization", f"{self.quantization!r} is not one of {expected}")
        rows = self.quant_check_rows
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            raise JobSpecError("quant_check_rows", f"must be a non-negative integer, got {rows!r}")
        if rows and self.quantization is None:
            raise JobSpecError("quant_check_rows", "compares FP8 with the unquantized model: it needs quantization")
        if self.quantization is not None and self.mode in UNQUANTIZED_MODES:
            raise JobSpecError("quantization", f"{self.mode} jobs run the model's own weights in this version of "
                                               "Barge (FP8 has no quality check for them yet); submit without "
                                               "quantization")

    def _validate_dtype(self) -> None:
        if self.dtype not in DTYPES:
            expected = ", ".join(repr(d) for d in DTYPES if d) + " or null"
            raise JobSpecError("dtype", f"{self.dtype!r} is not one of {expected}")
        if self.dtype is not None and self.mode != "embed":
            raise JobSpecError("dtype", f"applies to embed jobs only, not mode {self.mode!r}")
        if self.dtype is not None and self.quantization is not None:
            raise JobSpecError("dtype", "give dtype or quantization, not both")

    def _validate_kv_cache_dtype(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            expected = ", ".join(repr(d) for d in KV_CACHE_DTYPES if d) + " or null"
            raise JobSpecError("kv_cache_dtype", f"{self.kv_cache_dtype!r} is not one of {expected}")
        if self.kv_cache_dtype is not None and self.mode != "generate":
            raise JobSpecError("kv_cache_dtype", f"applies to generate jobs only, not mode {self.mode!r}")

    def _validate_adapter(self) -> None:
        if self.adapter is None:
            return
        _require_text("adapter", self.adapter)
        if self.mode != "generate":
            raise JobSpecError("adapter", f"applies to generate jobs only, not mode {self.mode!r}")
        if self.params.get("adapter_column") is not None:
            raise JobSpecError("adapter", "give adapter (every row's) or params.adapter_column (each row's), not both")

    def _validate_webhook_events(self) -> None:
        if not isinstance(self.webhook_events, tuple):
            raise JobSpecError("webhook_events", f"must be a list of event types, got {self.webhook_events!r}")
        for name in self.webhook_events:
            if name not in OPT_IN_EVENT_TYPES:
                raise JobSpecError("webhook_events", f"{name!r} is not one of {', '.join(OPT_IN_EVENT_TYPES)}")
        if self.webhook_events and self.webhook_url is None:
            raise JobSpecError("webhook_events", "needs a webhook_url")

    def _validate_params(self) -> None:
        accepted = MODE_PARAMS[self.mode]
        for name, value in self.params.items():
            if name not in accepted:
                known = ", ".join(accepted) or "none"
                raise JobSpecError(f"params.{name}", f"unknown parameter for mode {self.mode!r} (known: {known})")
            types, description = accepted[name]
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                raise JobSpecError(f"params.{name}", f"must be {description}, got {value!r}")
        dimensions = self.params.get("dimensions")
        if dimensions is not None and dimensions < 1:
            raise JobSpecError("params.dimensions", f"must be a positive integer, got {dimensions!r}")
        if self.params.get("output_dtype", "float32") not in ("float32", "float16"):
            raise JobSpecError("params.output_dtype", f'must be "float32" or "float16", got {self.params["output_dtype"]!r}')
        if self.params.get("prompt") is not None and self.params.get("prompt_name") is not None:
            raise JobSpecError("params.prompt_name", "give prompt or prompt_name, not both")
        if self.params.get("structured_whitespace", "compact") not in STRUCTURED_WHITESPACES:
            raise JobSpecError("params.structured_whitespace",
                               f'must be "compact" or "any", got {self.params["structured_whitespace"]!r}')
        if self.params.get("system_prompt") is not None and not self.params.get("chat"):
            raise JobSpecError("params.system_prompt", "applies to chat prompts: set params.chat to true")
        problem = params_problem(self.mode, self.params)
        if problem is not None:
            raise JobSpecError(*problem)

    @property
    def inputs(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["input"] = self.inputs if not isinstance(self.input, str) else self.input
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "JobSpec":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise JobSpecError(unknown[0], "unknown field")
        return cls(**data)


def _require_text(field_name: str, value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise JobSpecError(field_name, f"must be a non-empty string, got {value!r}")
