"""SamplingParams: how one request's tokens are chosen and when it stops."""

from __future__ import annotations

from dataclasses import dataclass

from engine.generate.structured import StructuredOutput


@dataclass(frozen=True)
class SamplingParams:
    """Validated on construction; a bad value raises ValueError naming the parameter."""

    max_tokens: int = 16                  # most tokens to generate (finish_reason "length" there)
    temperature: float = 1.0              # 0 = greedy
    top_k: int | None = None              # keep the k likeliest tokens; None = all
    top_p: float = 1.0                    # keep the smallest set with this much probability mass
    seed: int | None = None               # per-request generator: the same row gives the same output
    stop: tuple[str, ...] = ()            # text never contains these; generation ends at the first
    stop_token_ids: tuple[int, ...] = ()  # extra tokens that end generation (kept in token_ids)
    ignore_eos: bool = False              # generate max_tokens even past the model's EOS
    logprobs: int | None = None           # per generated token: its log-prob and the top-N; None = off
    prompt_logprobs: int | None = None    # the same for each prompt token after the first
    # the text must follow this: {"json_schema": ...} | {"json_object": True} | {"regex": ...}
    # | {"choice": [...]} | {"grammar": ...}; kept as a StructuredOutput (engine.generate.structured)
    structured: StructuredOutput | dict | None = None
    structured_whitespace: str = "compact"  # a JSON constraint's whitespace: "compact" (one line, ", " and ": ")
                                            # or "any" (xgrammar's default; a sampling model can run on in spaces)
    jump_forward: bool | None = None      # structured: append the tokens the grammar forces without a step
                                          # each; None = the engine's GenerateOptions.enable_jump_forward

    def __post_init__(self) -> None:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids or ()))
        _check_int("max_tokens", self.max_tokens, minimum=1)
        _check_number("temperature", self.temperature, minimum=0.0)
        if self.top_k is not None:
            _check_int("top_k", self.top_k, minimum=1)
        _check_number("top_p", self.top_p, minimum=0.0)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None:
            _check_int("seed", self.seed, minimum=0)
        if any(not isinstance(text, str) or not text for text in stop):
            raise ValueError(f"stop must be non-empty strings, got {self.stop!r}")
        for token_id in self.stop_token_ids:
            _check_int("stop_token_ids", token_id, minimum=0)
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), minimum=0)
        if self.jump_forward is not None and not isinstance(self.jump_forward, bool):
            raise ValueError(f"jump_forward must be a boolean or None, got {self.jump_forward!r}")
        object.__setattr__(self, "structured", StructuredOutput.parse(self.structured, self.structured_whitespace))

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _check_number(name: str, value: object, minimum: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= minimum or value == float("inf"):
        raise ValueError(f"{name} must be a finite number >= {minimum}, got {value!r}")
