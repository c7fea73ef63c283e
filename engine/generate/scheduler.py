"""Scheduler: which requests advance this step, and by how many tokens.

Running requests go first (their decodes and unfinished prompt chunks), oldest first;
then waiting ones are admitted while the token budget, max_num_seqs and free blocks
allow. When a running request cannot get a block, the newest running request is
preempted: its blocks are freed and it is recomputed later (its full blocks usually
come back from the prefix cache). Admission keeps a small reserve of free blocks so
that the decodes already running are not starved into a preemption storm.

NOTE: the prefix cache shares only blocks whose K/V are computed, and a step's blocks
are registered after it ran. Requests with a common prefix admitted before that would
each compute it. So a waiting request whose next uncached full block is one a running
or just-admitted request is computing (its hash is "in flight") is held back, and the
scan goes on to admit requests that share nothing with it; the next step finds that
block cached and admits it with the blocks after it:

    step 1   A1 admitted: computes template A (blocks a0..a80) + its suffix
             A2, A3 held (a0 in flight)      B1 admitted beside A1 (shares nothing)
    step 2   A2, A3 admitted: a0..a80 from the cache, their suffixes computed

While a request waits, its prompt's block hashes are pinned in the block manager, so
eviction takes other free blocks before a prefix some waiting row will hit.
SchedulerConfig.prefix_aware_admission=False turns both off (first come, first served).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.generate.block_manager import BlockManager
from engine.generate.prefix_order import PrefixPlan, plan_prefix_order
from engine.generate.request import Request, RequestStatus
from engine.lora.gate import admits


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 128               # requests in the running batch at once
    max_num_batched_tokens: int = 2048    # new tokens per step, decodes and prompt chunks together
    max_model_len: int = 2048             # prompt + output tokens of one request
    admission_reserve: float = 0.02       # fraction of blocks kept free when admitting
    prefix_aware_admission: bool = True   # hold back requests whose prefix another is computing; pin waiting
                                          # requests' prefix blocks against eviction (see NOTE above)

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
    num_prefill_tokens: int = 0       # prompt tokens computed this step (again after a preemption)

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
        self.num_prefill_tokens = 0       # prompt tokens computed by the steps that ran, all requests
        self.max_loras: int | None = None     # set with LoRA: adapters the running batch may hold (engine/lora/gate.py)

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)
        self._pin(request)

    def plan_waiting_by_prefix(self) -> PrefixPlan:
        """The waiting queue's prompts in prefix order (prefix_order.py), as queue positions."""
        return plan_prefix_order([request.prompt_token_ids for request in self.waiting])

    def order_waiting(self, plan: PrefixPlan) -> None:
        """Reorder the waiting queue as `plan` (of plan_waiting_by_prefix, queue unchanged
        since) says, keeping each LoRA adapter's rows together in the order the adapters
        first come: the adapter gate (engine/lora/gate.py) admits a few adapters at a time."""
        waiting = list(self.waiting)
        first_seen: dict[str | None, int] = {}
        for request in waiting:
            first_seen.setdefault(request.adapter_key, len(first_seen))
        order = sorted(plan.order, key=lambda position: first_seen[waiting[position].adapter_key])
        self.waiting = deque(waiting[position] for position in order)

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
                self._add_to_batch(output, request, num_new)
                budget -= num_new
                index += 1
        return budget

    def _schedule_waiting(self, output: SchedulerOutput, budget: int) -> None:
        reserve = int(self.config.admission_reserve * self.block_manager.num_blocks)
        in_flight = self._in_flight_block_hashes()
        for request in list(self.waiting):
            if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
                break
            # A grammar still compiling, an adapter that must wait, or a prefix another request is computing.
            if (not request.is_ready or not admits(request, self.running, self.max_loras)
                    or self._waits_for_prefix(request, in_flight)):
                continue
            cached = self.block_manager.find_cached_blocks(request)
            num_cached = len(cached) * self.block_manager.block_size
            num_new = min(request.num_tokens - num_cached, budget)
            if not self.block_manager.allocate_slots(request, num_new, cached, reserve):
                break
            if request.status == RequestStatus.WAITING:
                request.num_cached_tokens = num_cached
            output.num_cached_tokens += num_cached
            self.waiting.remove(request)
            self.block_manager.unpin_prefix(request)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            self._add_to_batch(output, request, num_new)
            budget -= num_new
            if self.config.prefix_aware_admission:
                in_flight.update(self.block_manager.uncomputed_block_hashes(request))

    def _add_to_batch(self, output: SchedulerOutput, request: Request, num_new: int) -> None:
        output.requests.append(request)
        output.num_scheduled_tokens[request.request_id] = num_new
        output.num_prefill_tokens += max(0, min(num_new, request.num_prompt_tokens - request.num_computed_tokens))

    def _in_flight_block_hashes(self) -> set[int]:
        """Hashes of the full blocks running requests are still to compute (this step's
        chunks among them: a step's blocks are registered after it ran)."""
        if not self.config.prefix_aware_admission:
            return set()
        return {block_hash for request in self.running
                for block_hash in self.block_manager.uncomputed_block_hashes(request)}

    def _waits_for_prefix(self, request: Request, in_flight: set[int]) -> bool:
        """The request's first full block missing from the cache is in flight: admitted now,
        it would compute that block again. Hashes alone decide (admission checks tokens);
        a collision would only hold a request until the block's owner has computed it."""
        if not in_flight:
            return False
        cached = self.block_manager.hash_to_block_id
        first_missing = next((h for h in self.block_manager.cacheable_block_hashes(request) if h not in cached), None)
        return first_missing in in_flight

    def _pin(self, request: Request) -> None:
        if self.config.prefix_aware_admission:
            self.block_manager.pin_prefix(request)

    def _preempt(self, request: Request, output: SchedulerOutput) -> None:
        self.block_manager.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)
        self._pin(request)
        output.preempted.append(request)
        self.num_preemptions += 1

    def update_from_output(self, output: SchedulerOutput, sampled_token_ids: dict[int, int]) -> list[Request]:
        """Advance what ran; append sampled tokens; return the requests that finished."""
        self.num_prefill_tokens += output.num_prefill_tokens
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
            self.block_manager.unpin_prefix(request)
        self.block_manager.free(request)
