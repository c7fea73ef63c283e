"""StepStats: what one engine step held, for whoever watches (the worker's metrics).

    generate    one scheduler step: decodes and prompt chunks under max_num_seqs and
                max_num_batched_tokens, in KV-cache blocks of block_size tokens
    embed       one packed forward batch: real tokens under max_batch_tokens
    transcribe  one decoder step: one token per running chunk, each in a slot of the
                DecoderCache (a slot is one chunk's whole K/V, so it counts as a block)

Observers are plain callables on the mode engine's `step_observers` list (attach them
with Engine.add_step_observer). With none attached a step pays one truth test of an
empty list; the record is built only when someone listens. It carries counts only,
never tokens or text. An observer runs on the engine's thread between steps: it must
be quick and must not raise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class StepStats:
    num_seqs: int                           # sequences in the step's batch
    num_tokens: int                         # tokens the step fed the model (embed: real, unpadded)
    max_num_seqs: int | None                # the limit on num_seqs; None: the mode has none (embed)
    max_num_tokens: int | None              # the limit on num_tokens; None: none (transcribe)
    num_kv_blocks_used: int | None = None   # KV blocks held by running sequences; None: no KV cache (embed)
    num_kv_blocks: int | None = None        # KV blocks in all
    num_preemptions: int = 0                # sequences evicted for blocks in this step (generate)
    num_prefix_cache_hit_tokens: int = 0    # prompt tokens taken from the prefix cache, not computed (generate)
                                            # embed: tokens of a shared prompt prefix the batch's rows attend to
                                            # without running them (rows x its length; the prefix's own run is
                                            # a step of one sequence before them)
    num_prefill_tokens: int = 0             # prompt tokens computed in this step, again after a preemption (generate)
    num_forced_tokens: int = 0              # output tokens jump-forward appended, computed here without
                                            # a step of their own (generate, structured output)

    @property
    def occupancy(self) -> float:
        """The share of the tighter limit this step used: 1.0 means the batch was full.
        A decode-heavy generate step is bound by sequences, a prefill by tokens."""
        shares = [used / limit for used, limit in ((self.num_seqs, self.max_num_seqs),
                                                  (self.num_tokens, self.max_num_tokens)) if limit]
        return max(shares, default=0.0)

    @property
    def kv_cache_usage(self) -> float | None:
        if not self.num_kv_blocks:
            return None
        return self.num_kv_blocks_used / self.num_kv_blocks


StepObserver = Callable[[StepStats], None]


def notify(observers: list[StepObserver], stats: StepStats) -> None:
    for observer in observers:
        observer(stats)
