"""Out of memory in a step: the engine lowers its budget and runs the rows again.

A CUDA out-of-memory error in a forward pass leaves the model and the KV cache as they
were (PyTorch frees the failed step's temporaries as the exception unwinds), so the
step can simply be retried smaller. The embed path splits the failed batch under a
halved token budget; the generate path preempts the step's requests (they recompute,
mostly from the prefix cache) under halved token and sequence budgets. The lower budget
stays for the engine's life: memory that ran out once will run out again. Only a row
that fails alone at the smallest budget becomes an error row (OOM_ROW_ERROR).

NOTE: BARGE_TEST_OOM_ABOVE_TOKENS=N is a test hook, read once when an engine is built:
a step of more than N tokens raises the real torch.OutOfMemoryError before it runs, as
a device with room for N tokens of activations would. It lets a CPU test drive the
recovery through a real worker; never set it in production.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace

import torch

log = logging.getLogger("barge.engine")

INJECT_VARIABLE = "BARGE_TEST_OOM_ABOVE_TOKENS"
OOM_ROW_ERROR = "out of memory: this row alone does not fit on the device"


@dataclass
class OomGuard:
    """One engine's out-of-memory record and its test hook."""

    inject_above_tokens: int | None = None   # the test hook's limit; None: off
    num_ooms: int = 0                        # out-of-memory errors survived (the step ran again smaller)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "OomGuard":
        env = os.environ if env is None else env
        value = env.get(INJECT_VARIABLE, "")
        if not value:
            return cls()
        if not value.isdigit():
            raise ValueError(f"{INJECT_VARIABLE}: {value!r} is not a number of tokens")
        return cls(inject_above_tokens=int(value))

    def check(self, num_tokens: int) -> None:
        """Before a step of `num_tokens` tokens: raise the test hook's out-of-memory error."""
        if self.inject_above_tokens is not None and num_tokens > self.inject_above_tokens:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory: a step of {num_tokens} tokens (injected: {INJECT_VARIABLE}="
                f"{self.inject_above_tokens})")

    def record(self, error: BaseException, device: torch.device, lowered_to: str) -> None:
        """After an out-of-memory error: release the failed step's cached blocks, count it, log it."""
        self.num_ooms += 1
        if device.type == "cuda":
            torch.cuda.empty_cache()
        log.warning("out of memory in a step (%d so far); %s: %s", self.num_ooms, lowered_to,
                    str(error).splitlines()[0][:200])


def halved(budget: int, floor: int) -> int | None:
    """The next lower budget after an out-of-memory error; None when it is already at its floor."""
    if budget <= floor:
        return None
    return max(floor, budget // 2)


MIN_BATCHED_TOKENS = 16      # generate: the token budget is never lowered below this (one KV block)


def recover_generate_step(llm, output, error: BaseException) -> list:
    """After a generate step (engine.generate.LLMEngine.step) ran out of memory: halve its
    token and sequence budgets and put the step's requests back at the head of the queue
    to recompute; or, when the step was one request at the smallest budget, end that
    request with an error. Returns the requests it ended (the step's finished ones)."""
    scheduler = llm.scheduler
    config = scheduler.config
    tokens = halved(config.max_num_batched_tokens, MIN_BATCHED_TOKENS)
    if tokens is None and len(output.requests) == 1:
        request = output.requests[0]
        request.error = f"{OOM_ROW_ERROR} ({request.num_tokens} tokens)"
        llm.oom_guard.record(error, llm.runner.device, f"request of {request.num_tokens} tokens ended with an error")
        from engine.generate.request import RequestStatus
        scheduler.finish(request, RequestStatus.FINISHED_ABORTED)
        return [request]
    seqs = halved(config.max_num_seqs, 1) or 1
    scheduler.config = replace(config, max_num_batched_tokens=tokens or MIN_BATCHED_TOKENS, max_num_seqs=seqs)
    for request in reversed(output.requests):
        _requeue(scheduler, request)
    llm.oom_guard.record(error, llm.runner.device, f"max_num_batched_tokens lowered to "
                         f"{scheduler.config.max_num_batched_tokens}, max_num_seqs to {seqs}")
    return []


def _requeue(scheduler, request) -> None:
    """As a preemption: its blocks freed, recomputed from its first token (its full blocks
    usually come back from the prefix cache), first in line."""
    from engine.generate.request import RequestStatus
    if request in scheduler.running:
        scheduler.running.remove(request)
    scheduler.block_manager.free(request)
    request.num_computed_tokens = 0
    request.status = RequestStatus.PREEMPTED
    scheduler.waiting.appendleft(request)


def in_halves(items: list, run, guard: OomGuard, device: torch.device) -> list:
    """run(batch) -> one result per item of the batch, over `items` at once; a batch that
    runs out of memory is run again as two halves, down to single items. An item that runs
    out alone gets None. For the passes that take whatever they are given at once
    (transcription's language detection and word timing); the test hook counts items."""
    if not items:
        return []
    try:
        guard.check(len(items))
        return list(run(items))
    except torch.OutOfMemoryError as error:
        if len(items) == 1:
            guard.record(error, device, "an item that does not fit alone ends with an error")
            return [None]
        middle = len(items) // 2
        guard.record(error, device, f"a batch of {len(items)} split in two")
    return in_halves(items[:middle], run, guard, device) + in_halves(items[middle:], run, guard, device)
