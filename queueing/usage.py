"""What one shard used: rows, tokens, row errors by kind, and the engine that ran it.

Recorded with the shard's commit (throughput, `barge report`) and counted in the
worker's metrics. Error kinds are a small fixed set so that a metric label never
carries a row's own text.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

ERROR_KINDS = ("null_input", "bad_type", "empty_input", "too_long", "other")

# Substrings of the engines' per-row error messages -> kind; first match wins.
_ERROR_PATTERNS = (
    ("is null", "null_input"),
    ("is not", "bad_type"),
    ("must ", "bad_type"),
    ("is empty", "empty_input"),
    ("has no tokens", "empty_input"),
    ("max_seq_length", "too_long"),
    ("the context holds", "too_long"),
    ("too long", "too_long"),
)


@dataclass(frozen=True)
class ShardUsage:
    model: str                          # model key
    mode: str
    num_rows: int
    rows_failed: int
    num_tokens: int                     # embed: tokens fed to the model; generate: prompt + output;
                                        # transcribe: tokens decoded
    error_kinds: dict[str, int] = field(default_factory=dict)   # kind (ERROR_KINDS) -> failed rows
    engine: dict = field(default_factory=dict)                  # engine_settings(); "device" among them

    @property
    def device(self) -> str:
        return self.engine.get("device", "unknown")


def shard_usage(model: str, mode: str, outputs: list, engine: dict) -> ShardUsage:
    kinds = Counter(error_kind(out.error) for out in outputs if out.error is not None)
    return ShardUsage(model=model, mode=mode, num_rows=len(outputs), rows_failed=sum(kinds.values()),
                      num_tokens=sum(num_tokens(out) for out in outputs), error_kinds=dict(kinds), engine=engine)


def num_tokens(output) -> int:
    """Tokens one row cost, whatever its mode's output type."""
    if hasattr(output, "num_prompt_tokens"):   # generate: prompt plus generated tokens
        return int(output.num_prompt_tokens) + len(getattr(output, "token_ids", ()) or ())
    return int(getattr(output, "num_tokens", 0) or 0)


def error_kind(message: str) -> str:
    lowered = message.lower()
    for pattern, kind in _ERROR_PATTERNS:
        if pattern in lowered:
            return kind
    return "other"


def engine_settings(engine, model: str, mode: str) -> dict:
    """The loaded engine's settings as JSON-able values.

    NOTE: `Engine` has no settings accessor yet, so this reads what its mode objects
    expose (the weights' device and dtype, the embedder's batch budget, the generate
    options) and leaves out what it cannot find."""
    settings: dict = {"model": model, "mode": mode}
    parameter = _first_parameter(engine)
    if parameter is not None:
        settings["device"] = parameter.device.type
        settings["dtype"] = str(parameter.dtype).removeprefix("torch.")
    else:
        settings["device"] = current_device_type()
    if settings["device"] == "cuda":
        import torch
        settings["device_name"] = torch.cuda.get_device_name(parameter.device if parameter is not None else None)
    embedder = getattr(engine, "_embedder", None)
    if embedder is not None and hasattr(embedder, "max_batch_tokens"):
        settings["max_batch_tokens"] = int(embedder.max_batch_tokens)
    options = getattr(getattr(engine, "llm", None), "options", None)
    if options is not None:
        from dataclasses import asdict, is_dataclass
        if is_dataclass(options):
            settings["generate"] = {k: v for k, v in asdict(options).items() if _is_json_scalar(v)}
    return settings


def current_device_type() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def _first_parameter(engine):
    import torch
    llm = getattr(engine, "llm", None)
    transcriber = getattr(getattr(engine, "transcriber", None), "decoder", None)
    for holder in (getattr(engine, "_embedder", None), llm, getattr(llm, "runner", None), transcriber):
        for value in (vars(holder).values() if holder is not None else ()):
            if isinstance(value, torch.nn.Module):
                return next(value.parameters(), None)
    return None


def _is_json_scalar(value) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))
