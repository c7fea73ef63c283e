"""An OpenAI batch input file, checked line by line before anything is queued.

Each line is {"custom_id", "method": "POST", "url": ENDPOINT, "body": {...}} with the
body of the synchronous endpoint, each line read as strict JSON (api.json_lines). A file
that breaks a rule is refused as OpenAI refuses it: the batch is `failed` with one error
per bad line ({code, message, param, line}, physical lines counted from 1), and no job
is made. A good file becomes `BatchRequests`: one row per prompt or embedding input (a
line may hold several: a list `input` or `prompt`), the Barge params they share, and
what formatting each line asks for. A /v1/rerank or /v1/score line holds (query,
document) pairs (api.score_input), one row each, run as a job in mode "score".

NOTE: a Barge job has one model, so every line of a batch must ask for the same one
(as OpenAI requires), or for a LoRA adapter on it: a generate line's `model` may be
`BASE:ADAPTER` or `ADAPTER`, an adapter the server registered (api.batch_adapters), and the job's
adapter column gives each row its line's adapter (null: the base). Everything else is the
line's own, as each line is its own request to OpenAI: each row carries its line's params
as JSON in the job's input (the job's `params_column`, jobs.row_params). Sampling params
(max_tokens, temperature, seed, stop, response_format) run side by side in the engine's
batches; an embeddings line's `dimensions` gives its rows their own width (the job's
embedding column is then a list as long as each row's, storage.schemas). A score job's
rows share its params: the columns holding each pair's query and document.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from api.batch_adapters import ADAPTER_COLUMN, AdapterRefused, BatchAdapters, LineModel, split_model
from api.json_lines import NotJson, cut, json_type, load_line, physical_lines, shown
from api.score_input import RERANK, SCORE, BadPairs, ScorePairs, score_pairs
from engine.generate.structured import from_response_format

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
ENDPOINTS = (CHAT, COMPLETIONS, EMBEDDINGS, RERANK, SCORE)
ENDPOINT_MODES = {CHAT: "generate", COMPLETIONS: "generate", EMBEDDINGS: "embed", RERANK: "score", SCORE: "score"}
SCORE_ENDPOINTS = (RERANK, SCORE)

MAX_REQUESTS = 50_000          # lines per file, as OpenAI
MAX_TOP_LOGPROBS = {"/v1/chat/completions": 20, "/v1/completions": 5}   # as OpenAI
MAX_EMBEDDING_INPUTS = 50_000  # inputs over all lines of an embeddings batch, as OpenAI
DEFAULT_MAX_TOKENS = 1024      # OpenAI's default is "until the context is full"; a batch needs a bound
ROLES = ("system", "developer", "user", "assistant")
MAX_SCORE_PAIRS = 1_000_000    # (query, document) pairs over all lines of a rerank or score batch
PARAMS_COLUMN = "params"       # a batch's input column of per-row params (jobs.row_params)
DOCUMENT_COLUMN = "document"   # a score batch's input column of each pair's document; its query is the input
PAIR_COLUMN_PARAMS = {"query_column": "input", "document_column": DOCUMENT_COLUMN}

# Body fields each endpoint takes, beyond model and its prompt; any other is refused by
# name rather than ignored (a silently ignored `logprobs` would be a wrong answer).
SAMPLING_FIELDS = ("max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop", "n")
ACCEPTED_FIELDS = {
    CHAT: {"model", "messages", "user", "store", "stream", "response_format", "logprobs", "top_logprobs",
           *SAMPLING_FIELDS},
    COMPLETIONS: {"model", "prompt", "user", "stream", "logprobs", *SAMPLING_FIELDS},
    EMBEDDINGS: {"model", "input", "dimensions", "encoding_format", "user"},
    RERANK: {"model", "query", "documents", "top_n", "return_documents"},
    SCORE: {"model", "text_1", "text_2"},
}


@dataclass(frozen=True)
class LineError:
    """One entry of a failed batch's `errors.data`."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None

    def to_dict(self) -> dict:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


@dataclass
class BatchRequests:
    """A valid batch: its rows in order, and what is shared or per line."""

    endpoint: str
    model: str                                     # the base model every line runs on (the job's)
    params: dict                                   # the job's params: its params_column (and logprobs: 0,
                                                   # adapter_column); a score job's: PAIR_COLUMN_PARAMS
    custom_ids: list[str] = field(default_factory=list)       # line index -> custom_id
    line_models: list[str] = field(default_factory=list)      # line index -> `model` as the line gave it
    encodings: list[str] = field(default_factory=list)        # line index -> "float" | "base64" (embeddings)
    top_ns: list[int | None] = field(default_factory=list)    # line index -> rerank's top_n (None: all)
    return_documents: list[bool] = field(default_factory=list)  # line index -> rerank's results carry documents
    row_lines: list[int] = field(default_factory=list)        # row -> line index (0-based)
    row_items: list[int] = field(default_factory=list)        # row -> position in its line's input list
    row_inputs: list = field(default_factory=list)            # row -> prompt text, messages, text to embed,
                                                              # or a pair's query (rerank, score)
    row_documents: list[str] = field(default_factory=list)    # row -> its pair's document (rerank, score only)
    row_params: list[dict] = field(default_factory=list)      # row -> its line's params (sampling; embed: dimensions)
    row_adapters: list[str | None] = field(default_factory=list)  # row -> its line's adapter location (None: base)

    @property
    def num_lines(self) -> int:
        return len(self.custom_ids)


class _Refused(Exception):
    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.error = LineError(code, message, param=param)


def parse_batch(data: bytes, endpoint: str, known_models: dict[str, str | tuple[str, ...]],
                embedding_widths: dict[str, int] | None = None,
                adapters: BatchAdapters | None = None) -> BatchRequests | list[LineError]:
    """The file's requests, or every error found (each naming its line).
    `known_models`: model name -> the modes it serves (jobs.models.model_modes: an embed
    or generate model also scores pairs), or its one mode ("generate", "embed", ...);
    `embedding_widths`: embed model name -> its vector length, the most `dimensions` a
    line may ask (a model not named there is held to it when its rows run); `adapters`:
    the LoRA adapters a generate line may name as BASE:ADAPTER (None: none)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        return [LineError("invalid_file", f"the file is not UTF-8 text ({error.reason} at byte {error.start})")]
    lines = list(physical_lines(text))   # numbered as an editor shows them (api.json_lines)
    if not lines:
        return [LineError("empty_file", "the file has no requests")]
    if len(lines) > MAX_REQUESTS:
        return [LineError("too_many_requests", f"the file has {len(lines)} requests; a batch takes at most "
                                               f"{MAX_REQUESTS}")]
    batch: BatchRequests | None = None
    errors: list[LineError] = []
    first_line: dict[str, int] = {}                # custom_id -> line it first appeared on
    for number, line in lines:
        try:
            request = _parse_line(line, endpoint)
            custom_id = request["custom_id"]
            if custom_id in first_line:
                raise _Refused("duplicate_custom_id", f"the custom_id {shown(custom_id)} is a duplicate of line "
                                                      f"{first_line[custom_id]}'s; custom_id must be unique in a batch",
                               "custom_id")
            first_line[custom_id] = number
            batch = _add_request(batch, request, endpoint, known_models, embedding_widths or {},
                                 adapters or BatchAdapters.none())
        except _Refused as refused:
            errors.append(LineError(refused.error.code, refused.error.message, line=number, param=refused.error.param))
    if errors:
        return errors
    if endpoint == EMBEDDINGS and len(batch.row_inputs) > MAX_EMBEDDING_INPUTS:
        return [LineError("too_many_inputs", f"the batch has {len(batch.row_inputs)} embedding inputs; at most "
                                             f"{MAX_EMBEDDING_INPUTS}")]
    if endpoint in SCORE_ENDPOINTS and len(batch.row_inputs) > MAX_SCORE_PAIRS:
        return [LineError("too_many_inputs", f"the batch has {len(batch.row_inputs)} (query, document) pairs; at "
                                             f"most {MAX_SCORE_PAIRS}")]
    return _with_adapter_column(_with_logprobs_column(batch))


def _with_adapter_column(batch: BatchRequests) -> BatchRequests:
    """Lines naming adapters make the job's rows carry theirs (jobs.row_params); a batch of
    the base alone names no column, and runs on the worker's plain engine."""
    if any(location is not None for location in batch.row_adapters):
        batch.params = {**batch.params, "adapter_column": ADAPTER_COLUMN}
    return batch


def _with_logprobs_column(batch: BatchRequests) -> BatchRequests:
    """A job's output has a logprobs column only when its params ask (storage.schemas): when
    any line does, the job asks with N = 0 and every row says for itself (null: not this one)."""
    if any(params.get("logprobs") is not None for params in batch.row_params):
        batch.params = {**batch.params, "logprobs": 0}
        batch.row_params = [{"logprobs": None, **params} for params in batch.row_params]
    return batch


def _parse_line(line: str, endpoint: str) -> dict:
    try:
        request = load_line(line)
    except NotJson as error:
        raise _Refused("invalid_json_line", f"this line is not valid JSON ({error})") from None
    if not isinstance(request, dict):
        raise _Refused("invalid_json_line", f"each line must be a JSON object, not {json_type(request)}")
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise _Refused("missing_required_parameter", "the request has no custom_id (a non-empty string)", "custom_id")
    if len(custom_id) > 512:
        raise _Refused("invalid_value", "custom_id is longer than 512 characters", "custom_id")
    if request.get("method") != "POST":
        raise _Refused("invalid_value", f"method must be \"POST\", got {shown(request.get('method'))}", "method")
    if request.get("url") != endpoint:
        raise _Refused("mismatched_endpoint", f"the request's url {shown(request.get('url'))} is not the batch's "
                                              f"endpoint {endpoint}", "url")
    body = request.get("body")
    if body is None:
        raise _Refused("missing_required_parameter", "the request has no body object", "body")
    if not isinstance(body, dict):
        raise _Refused("invalid_value", f"the request's body must be a JSON object, not {json_type(body)}", "body")
    return request


def _add_request(batch: BatchRequests | None, request: dict, endpoint: str, known_models: dict,
                 embedding_widths: dict[str, int], adapters: BatchAdapters) -> BatchRequests:
    body = request["body"]
    unknown = sorted(set(body) - ACCEPTED_FIELDS[endpoint])
    if unknown:
        raise _Refused("unsupported_parameter", f"{_names(unknown)} {'is' if len(unknown) == 1 else 'are'} not "
                                                f"supported by this server for {endpoint}", f"body.{cut(unknown[0])}")
    line_model = _model(body, endpoint, known_models, adapters)
    if batch is not None and line_model.base != batch.model:   # before its adapter is read: the base is wrong
        raise _Refused("mismatched_model", f"the model {shown(body['model'])} differs from the batch's "
                                           f"{batch.model!r}; a batch takes one model (and adapters on it, as "
                                           f"{batch.model}:ADAPTER)", "body.model")
    adapter = _adapter_location(line_model, endpoint, adapters)
    model = line_model.base
    pairs = _pairs(body, endpoint) if endpoint in SCORE_ENDPOINTS else None
    if pairs is not None:   # a score job's rows share its params (PAIR_COLUMN_PARAMS)
        params, inputs = {}, pairs.queries
    else:
        params = (_embedding_params(body, embedding_widths.get(model)) if endpoint == EMBEDDINGS
                  else _sampling_params(body, endpoint))
        inputs = _inputs(body, endpoint)
    if batch is None:
        batch = BatchRequests(endpoint=endpoint, model=model, params=(
            dict(PAIR_COLUMN_PARAMS) if pairs is not None else {"params_column": PARAMS_COLUMN}))
    line_index = batch.num_lines
    batch.custom_ids.append(request["custom_id"])
    batch.line_models.append(body["model"])
    batch.encodings.append(body.get("encoding_format", "float"))
    batch.top_ns.append(pairs.top_n if pairs is not None else None)
    batch.return_documents.append(pairs is not None and pairs.return_documents)
    for item, value in enumerate(inputs):
        batch.row_lines.append(line_index)
        batch.row_items.append(item)
        batch.row_inputs.append(value)
        batch.row_params.append(params)
        batch.row_adapters.append(adapter)
    if pairs is not None:
        batch.row_documents.extend(pairs.documents)
    return batch


def _pairs(body: dict, endpoint: str) -> ScorePairs:
    try:
        return score_pairs(body, endpoint)
    except BadPairs as refused:
        raise _Refused(refused.code, refused.message, refused.param) from None


def _model(body: dict, endpoint: str, known_models: dict, adapters: BatchAdapters) -> LineModel:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _Refused("missing_required_parameter", "the body has no model", "body.model")
    line_model = split_model(model, known_models)
    if line_model.base not in known_models and model in adapters.locations:   # an adapter alone, as vLLM's
        try:
            line_model = LineModel(adapters.base_of(model, known_models), model)
        except AdapterRefused as refused:
            raise _Refused(refused.code, refused.message, "body.model") from None
    served = known_models.get(line_model.base)
    if served is None:
        raise _Refused("model_not_found", f"the model {shown(model)} does not exist; this server serves "
                                          f"{', '.join(sorted(known_models)) or 'none'}", "body.model")
    modes = (served,) if isinstance(served, str) else served
    if ENDPOINT_MODES[endpoint] not in modes:
        raise _Refused("model_not_found", f"the model {shown(line_model.base)} is a model for {' and '.join(modes)}, "
                                          f"not for {endpoint}", "body.model")
    return line_model


def _adapter_location(line_model: LineModel, endpoint: str, adapters: BatchAdapters) -> str | None:
    """Where the line's adapter is (None: the base model alone), checked against the base."""
    if line_model.adapter is None:
        return None
    if ENDPOINT_MODES[endpoint] != "generate":
        raise _Refused("invalid_value", f"{endpoint} takes no adapter; LoRA adapters serve {CHAT} and "
                                        f"{COMPLETIONS}", "body.model")
    try:
        return adapters.location(line_model)
    except AdapterRefused as refused:
        raise _Refused(refused.code, refused.message, "body.model") from None


def _embedding_params(body: dict, width: int | None) -> dict:
    """The line's row params: its `dimensions`, from 1 to the model's `width` (None: not known here)."""
    dimensions = body.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)
                                   or dimensions < 1 or (width is not None and dimensions > width)):
        bound = f"an integer from 1 to {width}, the model's width" if width is not None else "a positive integer"
        raise _Refused("invalid_value", f"dimensions must be {bound}, got {shown(dimensions)}", "body.dimensions")
    if body.get("encoding_format", "float") not in ("float", "base64"):
        raise _Refused("invalid_value", "encoding_format must be \"float\" or \"base64\"", "body.encoding_format")
    return {"dimensions": dimensions} if dimensions is not None else {}


def _sampling_params(body: dict, endpoint: str) -> dict:
    if body.get("stream"):
        raise _Refused("invalid_value", "stream is not supported in a batch", "body.stream")
    if body.get("n", 1) != 1:
        raise _Refused("invalid_value", f"n must be 1, got {shown(body.get('n'))}", "body.n")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens", DEFAULT_MAX_TOKENS))
    params = {"max_tokens": max_tokens, "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0)}
    if body.get("seed") is not None:
        params["seed"] = body["seed"]
    stop = body.get("stop")
    if stop is not None:
        params["stop"] = [stop] if isinstance(stop, str) else stop
    _check_sampling(params)
    structured = _structured(body.get("response_format"))
    if structured is not None:
        params["structured"] = structured
    num_top = _logprobs(body, endpoint)
    if num_top is not None:
        params["logprobs"] = num_top
    return params


def _structured(response_format: object) -> dict | None:
    """Its shape here; a schema that does not compile becomes the request's error (jobs.row_params)."""
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema" and not isinstance(
            response_format.get("json_schema"), dict):   # from_response_format would raise AttributeError
        raise _Refused("invalid_value", "response_format.json_schema must be an object", "body.response_format")
    try:
        return from_response_format(response_format)
    except ValueError as error:   # it echoes the type asked for: cut
        raise _Refused("invalid_value", cut(str(error), 120), "body.response_format")


def _logprobs(body: dict, endpoint: str) -> int | None:
    """The engine's `logprobs` (alternatives per token) a line asks for, or None.
    Chat: `logprobs` true, with `top_logprobs` 0..20; completions: `logprobs` 0..5."""
    maximum = MAX_TOP_LOGPROBS[endpoint]
    if endpoint == CHAT:
        asked, num_top = body.get("logprobs"), body.get("top_logprobs")
        if asked is not None and not isinstance(asked, bool):
            raise _Refused("invalid_value", f"logprobs must be a boolean, got {shown(asked)}", "body.logprobs")
        if num_top is not None and not asked:
            raise _Refused("invalid_value", "top_logprobs needs logprobs set to true", "body.top_logprobs")
        if not asked:
            return None
        param = "body.top_logprobs"
    else:
        num_top, param = body.get("logprobs"), "body.logprobs"
        if num_top is None:
            return None
    num_top = 0 if num_top is None else num_top
    if isinstance(num_top, bool) or not isinstance(num_top, int) or not 0 <= num_top <= maximum:
        raise _Refused("invalid_value", f"{param.removeprefix('body.')} must be an integer from 0 to {maximum}, got "
                                        f"{shown(num_top)}", param)
    return num_top


def _check_sampling(params: dict) -> None:
    max_tokens = params["max_tokens"]
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise _Refused("invalid_value", f"max_tokens must be a positive integer, got {shown(max_tokens)}",
                       "body.max_tokens")
    for name, low, high in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        value = params[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise _Refused("invalid_value", f"{name} must be a number from {low:g} to {high:g}, got {shown(value)}",
                           f"body.{name}")
    if params["top_p"] == 0:
        raise _Refused("invalid_value", "top_p must be above 0", "body.top_p")
    seed = params.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise _Refused("invalid_value", f"seed must be a non-negative integer, got {shown(seed)}", "body.seed")
    stop = params.get("stop")
    if stop is not None and (not isinstance(stop, list) or len(stop) > 4
                             or not all(isinstance(s, str) and s for s in stop)):
        raise _Refused("invalid_value", "stop must be a string or a list of up to 4 non-empty strings", "body.stop")


def _inputs(body: dict, endpoint: str) -> list:
    if endpoint == CHAT:
        return [_messages(body.get("messages"))]
    name = "prompt" if endpoint == COMPLETIONS else "input"
    value = body.get(name)
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not values or not all(isinstance(v, str) and v for v in values):
        raise _Refused("invalid_value", f"{name} must be a non-empty string or a non-empty list of them "
                                        "(token ids are not supported)", f"body.{name}")
    return values


def _messages(messages: object) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise _Refused("missing_required_parameter", "messages must be a non-empty list", "body.messages")
    return [_message(message, index) for index, message in enumerate(messages)]


def _message(message: object, index: int) -> dict:
    param = f"body.messages[{index}]"
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise _Refused("invalid_value", f"each message needs a role among {', '.join(ROLES)}", param)
    content = message.get("content")
    if isinstance(content, list):   # content parts: only text ones
        if not all(isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
                   for part in content):
            raise _Refused("invalid_value", "only text content parts are supported", f"{param}.content")
        content = "".join(part["text"] for part in content)
    if not isinstance(content, str):
        raise _Refused("invalid_value", "content must be a string or a list of text parts", f"{param}.content")
    # developer is OpenAI's newer name for system; chat templates know system
    return {"role": "system" if message["role"] == "developer" else message["role"], "content": content}


def _names(names: list[str]) -> str:
    listed = ", ".join(cut(name) for name in names[:4])
    return listed + (f" and {len(names) - 4} more" if len(names) > 4 else "")


MAX_WINDOW_S = 86_400


def completion_window_s(window: object) -> int | None:
    """Seconds of a completion window: OpenAI's "24h", or (a Barge extension) any shorter
    "<n>h", "<n>m" or "<n>s"; None when it is not one."""
    if not isinstance(window, str) or len(window) < 2 or not window[:-1].isdigit() or window[-1] not in "hms":
        return None
    seconds = int(window[:-1]) * {"h": 3600, "m": 60, "s": 1}[window[-1]]
    return seconds if 0 < seconds <= MAX_WINDOW_S else None
