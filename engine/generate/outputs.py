"""GenerationOutput: what generate hands back for one prompt, in input order; FinishedRequest:
what step() hands back for one request it ended."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token with its log-probability, as OpenAI's logprobs report it."""

    token_id: int
    token: bytes                            # the token's bytes (a piece of UTF-8 text, maybe not whole)
    logprob: float
    top_logprobs: tuple["TokenLogprob", ...] = ()   # the `logprobs` likeliest tokens, likeliest first


@dataclass(frozen=True)
class GenerationOutput:
    token_ids: list[int]                    # generated tokens (an EOS or stop token id that ended it included)
    text: str                               # their text, special tokens and any stop string left out
    finish_reason: str | None               # "stop" | "length" | "abort"; None when error is set
    error: str | None = None                # why this row was not run ("prompt is empty", ...)
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0              # prompt tokens reused from the prefix cache
    logprobs: list[dict[int, float]] | None = None            # per generated token, when asked
    prompt_logprobs: list[dict[int, float] | None] | None = None   # per prompt token (first is None), when asked
    token_logprobs: list[TokenLogprob] | None = None          # logprobs with each token's bytes, when asked

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def is_ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class FinishedRequest:
    """A request that LLMEngine.step() ended, as its streaming callers receive it."""

    request_id: int                         # as add_request returned it
    output: GenerationOutput                # what generate would have returned for its prompt


def error_output(error: str, num_prompt_tokens: int = 0) -> GenerationOutput:
    return GenerationOutput(token_ids=[], text="", finish_reason=None, error=error, num_prompt_tokens=num_prompt_tokens)
