"""Request: one prompt's journey through the scheduler, from waiting to finished."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.generate.grammar import RequestGrammar
from engine.generate.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.lora.adapter import LoraAdapter


class RequestStatus(enum.IntEnum):
    """Ordered: everything after PREEMPTED is finished."""

    WAITING = 0             # not yet admitted; holds no blocks
    RUNNING = 1             # in the batch; holds blocks for its computed tokens
    PREEMPTED = 2           # evicted for blocks; waits again and recomputes what it lost
    FINISHED_STOPPED = 3    # EOS, a stop token id or a stop string
    FINISHED_LENGTH = 4     # max_tokens or the context limit
    FINISHED_ABORTED = 5    # cancelled by the caller

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.PREEMPTED

    @property
    def finish_reason(self) -> str | None:
        return {RequestStatus.FINISHED_STOPPED: "stop", RequestStatus.FINISHED_LENGTH: "length",
                RequestStatus.FINISHED_ABORTED: "abort"}.get(self)


@dataclass(eq=False)
class Request:
    """NOTE: there is no prefill phase nor decode phase: a request has num_computed_tokens
    and catches up to num_tokens, a chunk at a time. Decoding is catching up by one."""

    request_id: int
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()
    status: RequestStatus = RequestStatus.WAITING
    token_ids: list[int] = field(default_factory=list)      # prompt then outputs
    num_computed_tokens: int = 0        # tokens whose K/V sit in this request's blocks
    block_ids: list[int] = field(default_factory=list)      # block table: token i lives in block_ids[i // block_size]
    block_hashes: list[int] = field(default_factory=list)   # chained hash of each full block of token_ids
    num_cached_tokens: int = 0          # prompt tokens taken from the prefix cache at admission
    logprobs: list[dict[int, float]] = field(default_factory=list)
    prompt_logprobs: list[dict[int, float] | None] = field(default_factory=list)
    stop_text_len: int | None = None    # where a stop string cut the text
    grammar: RequestGrammar | None = None       # set when params.structured is: the output's matcher
    num_forced_tokens: int = 0          # output tokens appended by jump-forward, not sampled
    error: str | None = None            # why the request was ended without running (its output's error)
    adapter: LoraAdapter | None = None  # its LoRA adapter (engine/lora/); None: the base model

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids):]

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def uses_prefix_cache(self) -> bool:
        # Prompt log-probs need every prompt position's logits, so nothing may be skipped.
        return self.params.prompt_logprobs is None

    @property
    def adapter_key(self) -> str | None:
        """The adapter's identity (a hash of its files): it seeds the request's prefix-cache
        hashes, and the scheduler's gate counts running adapters by it."""
        return None if self.adapter is None else self.adapter.adapter_id

    @property
    def is_ready(self) -> bool:
        """May be scheduled: it has no grammar, or its grammar has finished compiling."""
        return self.grammar is None or self.grammar.is_ready

    def append_output(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        if self.grammar is not None:
            self.grammar.accept(token_id)

    def append_forced(self, token_ids: list[int]) -> None:
        """Tokens the grammar allows as the only continuation: appended without a forward
        pass of their own; the next step computes them with the next sampled token."""
        for token_id in token_ids:
            self.append_output(token_id)
        self.num_forced_tokens += len(token_ids)
