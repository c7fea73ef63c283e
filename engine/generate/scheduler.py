"""Scheduler: which requests advance this step, and by how many tokens.

Running requests go first (their decodes and unfinished prompt chunks), oldest first;
then waiting ones are admitted while the token budget, max_num_seqs and free blocks
allow. When a running request cannot get a block, the newest running request is
preempted: its blocks are freed and it is recomputed later (its full blocks usually
come back from the prefix cache). Admission keeps a small reserve of free blocks so
that the decodes already running are not starved into a preemption storm.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.generate.block_manager import BlockManager
from engine.generate.request import Request, RequestStatus


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 128               # requests in the running batch at once
    max_num_batched_tokens: int = 2048    # new tokens per step, decodes and prompt chunks together
    max_model_len: int = 2048             # prompt + output tokens of one request
    admission_reserve: float = 0.02       # fraction of blocks kept free when admitting

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not 0.0 <= self.admission_reserve < 1.0:
            raise ValueError(f"admission_reserve must be in [0, 1), got {self.admission_reserve!r}")


@dataclass
class SchedulerOutput:
    requests: list[Request]                                       # scheduled this step, in batch order
    num_scheduled_tokens: dict[int, int] = field(default_factory=dict)   # request_id -> new tokens this step
    preempted: list[Request] = field(default_factory=list)
    num_cached_tokens: int = 0        # prompt tokens admitted from the prefix cache (re-admissions too)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager):
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        output = SchedulerOutput(requests=[])
        budget = self._schedule_running(output, self.config.max_num_batched_tokens)
        if not output.preempted:      # blocks are short: admitting now would only preempt again
            self._schedule_waiting(output, budget)
        return output

    def _schedule_running(self, output: SchedulerOutput, budget: int) -> int:
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            while not self.block_manager.allocate_slots(request, num_new):
                victim = self.running.pop()
                self._preempt(victim, output)
                if victim is request:
                    break
            else:
                output.requests.append(request)
                output.num_scheduled_tokens[request.request_id] = num_new
                budget -= num_new
                index += 1
        return budget

    def _schedule_waiting(self, output: SchedulerOutput, budget: int) -> None:
        reserve = int(self.config.admission_reserve * self.block_manager.num_blocks)
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = next((r for r in self.waiting if r.is_ready), None)
            if request is None:       # every waiting request's grammar is still compiling
                break
            cached = self.block_manager.find_cached_blocks(request)
            num_cached = len(cached) * self.block_manager.block_size
            num_new = min(request.num_tokens - num_cached, budget)
            if not self.block_manager.allocate_slots(request, num_new, cached, reserve):
                break
            if request.status == RequestStatus.WAITING:
                request.num_cached_tokens = num_cached
            output.num_cached_tokens += num_cached
            self.waiting.remove(request)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            output.requests.append(request)
            output.num_scheduled_tokens[request.request_id] = num_new
            budget -= num_new

    def _preempt(self, request: Request, output: SchedulerOutput) -> None:
        self.block_manager.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)
        output.preempted.append(request)
        self.num_preemptions += 1

    def update_from_output(self, output: SchedulerOutput, sampled_token_ids: dict[int, int]) -> list[Request]:
        """Advance what ran; append sampled tokens; return the requests that finished."""
        finished = []
        for request in output.requests:
            if request.status != RequestStatus.RUNNING:
                continue
            request.num_computed_tokens += output.num_scheduled_tokens[request.request_id]
            self.block_manager.cache_full_blocks(request)
            token_id = sampled_token_ids.get(request.request_id)
            if token_id is None:      # a prompt chunk that did not reach the end
                continue
            request.append_output(token_id)
            status = self._stop_status(request, token_id)
            if status is not None:
                self.finish(request, status)
                finished.append(request)
        return finished

    def _stop_status(self, request: Request, token_id: int) -> RequestStatus | None:
        params, grammar = request.params, request.grammar
        if grammar is not None and grammar.is_rejected:
            request.error = f"structured output: token {token_id} was sampled outside the grammar"
            return RequestStatus.FINISHED_ABORTED
        if grammar is not None and grammar.is_terminated:      # complete, and its stop token taken
            return RequestStatus.FINISHED_STOPPED
        if token_id in params.stop_token_ids or (not params.ignore_eos and token_id in request.eos_token_ids):
            return RequestStatus.FINISHED_STOPPED
        if request.num_output_tokens >= params.max_tokens or request.num_tokens >= self.config.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def finish(self, request: Request, status: RequestStatus) -> None:
        """End a request (also from outside: stop strings, aborts) and free its blocks."""
        request.status = status
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.block_manager.free(request)
