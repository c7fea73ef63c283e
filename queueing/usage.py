"""What one shard used: rows, tokens, row errors by kind, and the engine that ran it.

Recorded with the shard's commit (throughput, `barge report`) and counted in the
worker's metrics. Error kinds are a small fixed set so that a metric label never
carries a row's own text.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

ERROR_KINDS = ("null_input", "bad_type", "empty_input", "too_long", "out_of_memory", "other")

# Substrings of the engines' per-row error messages -> kind; first match wins.
_ERROR_PATTERNS = (
    ("out of memory", "out_of_memory"),    # engine.oom: a row that does not fit on the device alone
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


def engine_settings(engine, model: str) -> dict:
    """The loaded engine's settings (Engine.settings: mode, device, dtype, quantization,
    its limits) under the model key it serves."""
    return {"model": model, **engine.settings}
