"""What one shard used: rows, tokens, row errors by kind, the engine that ran it, and for
a generate shard its prefill and rows per LoRA adapter (jobs.generate_usage).

Recorded with the shard's commit (throughput, `barge report`) and counted in the
worker's metrics. Error kinds are a small fixed set so that a metric label never
carries a row's own text.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from jobs.generate_usage import AdapterUsage, GenerateUsage, Prefill, in_order

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
    generate: GenerateUsage | None = None                       # generate: prefill, rows per adapter; else None

    @property
    def device(self) -> str:
        return self.engine.get("device", "unknown")


def shard_usage(model: str, mode: str, outputs: list, engine: dict, generate: GenerateUsage | None = None,
                ) -> ShardUsage:
    kinds = Counter(error_kind(out.error) for out in outputs if out.error is not None)
    return ShardUsage(model=model, mode=mode, num_rows=len(outputs), rows_failed=sum(kinds.values()),
                      num_tokens=sum(num_tokens(out) for out in outputs), error_kinds=dict(kinds), engine=engine,
                      generate=generate)


def generate_usage(outputs: list, adapters: list[str | None] | None, num_lower_bound: int | None) -> GenerateUsage:
    """A generate shard's prefill over the rows the engine ran (engine.generate.outputs.
    GenerationOutput), and with `adapters` (each output's row's LoRA adapter, None for the
    base model; None for a job without adapters) its rows and tokens per adapter.
    `num_lower_bound`: the shard's prefill lower bound, None if not measured."""
    prefill = Prefill(sum(out.num_prompt_tokens for out in outputs), sum(out.num_cached_tokens for out in outputs),
                      num_lower_bound)
    if adapters is None:
        return GenerateUsage(prefill)
    rows, tokens = Counter(), Counter()
    for adapter, out in zip(adapters, outputs, strict=True):
        rows[adapter] += 1
        tokens[adapter] += num_tokens(out)
    return GenerateUsage(prefill, in_order(AdapterUsage(adapter, rows[adapter], tokens[adapter]) for adapter in rows))


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
