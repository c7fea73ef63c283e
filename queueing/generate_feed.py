"""GenerateFeed: the pipeline's generate rows through one LLMEngine, a step at a time.

An engine call per chunk of rows (queueing.pipeline's path for embed and transcribe)
would drain the running batch at the end of every chunk: its last few long outputs
decode at a batch of one or two while the rest of the chunk, and the next shard, wait.
Here the rows of every shard in the pipeline are requests of one engine that keeps
stepping; new rows are added while the batch is still busy, so it stays full across
chunk and shard boundaries, and each finished request goes straight back to its shard.

Rows finish out of order (a short output overtakes a long one), so each output is put
at its row's place (ShardWork.put). A shard whose claim is lost has its requests
aborted, which frees their KV blocks for the others.

Rows are fed in prefix order (engine/generate/prefix_order.py; GenerateOptions.
order_by_prefix): on a shard's first rows its every prompt is tokenized (chat template
applied, as the engine would) and the shard's todo positions are permuted so that rows
sharing a template come together, deepest shared prefixes first. The pipeline still
hands out todo positions in order; the feed runs the row the permutation puts at each
one, and puts the output back at that row's own todo index, so results stay in input
order. The engine's cache outlives the shard, so a template computed for one shard
serves the next shard's rows too.

    todo index (pipeline)   0  1  2  3  4  5
    runs todo index         3  0  5  1  4  2      (A-rows 3 0 5, then B-rows 1 4 2)

A LoRA job's rows (EngineKey.lora) are fed in waves of at most the engine's max_loras
adapters (engine/lora/waves.py): the base model's rows with the first wave, then each
adapter's rows together, in prefix order among themselves (the prefix cache is keyed by
adapter). When a wave's first rows are queued, the engine reads the next wave's adapters
into its host cache on a background thread (LLMEngine.prefetch_adapters), so that they
are read while this wave runs and not when their rows are queued. A shard's first wave
starts with the adapters of the wave the feed queued last, which still hold their slots.

    todo index (pipeline)   0  1  2  3  4  5  6        adapters  A B - C A B D,  max_loras 2
    runs todo index         2  0  4  1  5  3  6        wave 0: - A A B B   wave 1: C D
                            ^ prefetch C D
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from engine.generate.outputs import error_output
from engine.generate.prefix_order import PrefixPlan, plan_prefix_order
from engine.lora.waves import Wave, WavePlan, plan_wave_order
from queueing.inference import row_sampling_params
from queueing.runtime import EngineKey
from queueing.worker import ShardWork

if TYPE_CHECKING:
    from engine.engine import Engine


@dataclass
class ShardOrder:
    """The order one shard's rows are fed in; kept until its last row is fed."""

    todo_indices: list[int]             # position k of the feed's order -> the todo index that runs there
    prompts: list[array | str]          # todo index -> its prompt's token ids, or why it has none
    num_prefill_lower_bound: int        # distinct prefix tokens of the shard's prompts (prefix_order.py),
                                        # summed over adapters for a LoRA job (waves.py)
    adapters: list[str | None] | None = None    # a LoRA job's: todo index -> its row's adapter (None: the base)
    waves: list[Wave] = field(default_factory=list)    # a LoRA job's; Wave.start is a position in todo_indices
    refused: list[int] = field(default_factory=list)   # todo indices of tokenized rows the engine would not queue


class GenerateFeed:
    """Talks to the engine through LLMEngine's streaming API only: add_requests, step, abort."""

    def __init__(self, engine: Engine, key: EngineKey):
        self.engine = engine            # mode "generate"
        self.llm = engine.llm
        self.key = key                  # the engine's: an FP8 job's rows never join a 16-bit engine's batch,
                                        # nor an fp8-KV job's rows a 16-bit cache's, or the reverse
        self._requests: dict[int, tuple[ShardWork, int]] = {}   # request id -> (its shard, its row's todo index)
        self._orders: dict[int, ShardOrder] = {}     # id(shard) -> its order, while it has rows to feed
        self.num_prefill_lower_bound = 0             # over the shards ordered so far: distinct prefix tokens
        self._running_adapters: tuple[str, ...] = ()   # the adapters of the wave queued last (LoRA jobs)

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    @property
    def wants_rows(self) -> int:
        """Rows to add now: enough waiting requests that the scheduler can refill the
        batch from them every step (two batches' worth in flight)."""
        return max(0, 2 * self.llm.options.max_num_seqs - len(self._requests))

    def serves(self, work: ShardWork) -> bool:
        return EngineKey.for_job(work.job) == self.key

    def add(self, work: ShardWork, rows: list[int], first_index: int) -> None:
        """Queue the rows at todo indices first_index.. (`rows`, positions in the shard, as the
        pipeline took them) as requests, in the shard's order (prefix order; a LoRA job's in
        waves of adapters): the rows the order puts at those indices. A row that cannot run
        (empty, too long) gets its error at once; bad sampling parameters raise ValueError
        (the shard fails, as with generate())."""
        if not self.llm.options.order_by_prefix:
            self._queue(work, [(first_index + offset, work.inputs[row]) for offset, row in enumerate(rows)])
            return
        order = self._orders.get(id(work)) or self._order(work)
        self._start_waves(order, first_index, first_index + len(rows))
        runnable = []
        for index in order.todo_indices[first_index:first_index + len(rows)]:
            prompt = order.prompts[index]
            if isinstance(prompt, str):         # why the row has no tokens
                work.put(index, error_output(prompt))
            else:
                runnable.append((index, list(prompt)))
        order.refused.extend(self._queue(work, runnable))
        if first_index + len(rows) >= len(work.todo):
            del self._orders[id(work)]
            if order.refused:
                self._bound_without_refused(work, order)

    def _queue(self, work: ShardWork, runnable: list[tuple[int, object]]) -> list[int]:
        """Add (todo index, prompt) pairs to the engine with their rows' sampling params; the
        todo indices it refused (an adapter that cannot be read), which get their errors."""
        rows = [work.todo[index] for index, _ in runnable]
        ids = work.ids.take(pa.array(rows, type=pa.int64()))
        row_params = [work.row_params[row] for row in rows] if work.row_params else None
        params = row_sampling_params(work.job.spec.params, ids, row_params)
        prompts = [prompt for _, prompt in runnable]
        # each row's LoRA adapter (JobSpec.adapter or params.adapter_column); None: the base model's rows
        todo_adapters = work.todo_adapters if self.key.lora else None
        adapters = None if todo_adapters is None else [todo_adapters[index] for index, _ in runnable]
        request_ids = (self.llm.add_requests(prompts, params) if adapters is None
                       else self.llm.add_requests(prompts, params, adapter=adapters))
        refused = []
        for (index, _), request_id in zip(runnable, request_ids):
            if isinstance(request_id, str):     # why the row cannot run
                work.put(index, error_output(request_id))
                refused.append(index)
            else:
                self._requests[request_id] = (work, index)
        return refused

    def _bound_without_refused(self, work: ShardWork, order: ShardOrder) -> None:
        """The shard's lower bound over the rows the engine ran: refused rows computed nothing.
        Planned again over those prompts, which costs a sort, only for a shard with refused rows."""
        refused = set(order.refused)
        ran = [index for index, prompt in enumerate(order.prompts)
               if not isinstance(prompt, str) and index not in refused]
        bound = self._plan(order.prompts, order.adapters, ran).num_distinct_tokens
        self.num_prefill_lower_bound -= order.num_prefill_lower_bound - bound
        work.num_prefill_lower_bound = bound

    def _order(self, work: ShardWork) -> ShardOrder:
        """Tokenize every row of the shard and plan their order; token ids kept as int32
        arrays (4 bytes a token, not a Python int's 28 + 8) until fed."""
        prompts = [self.llm.prompt_token_ids(work.inputs[row]) for row in work.todo]
        prompts = [prompt if isinstance(prompt, str) else array("i", prompt) for prompt in prompts]
        tokenized = [index for index, prompt in enumerate(prompts) if not isinstance(prompt, str)]
        adapters = work.todo_adapters if self.key.lora else None
        plan = self._plan(prompts, adapters, tokenized)
        untokenized = [index for index, prompt in enumerate(prompts) if isinstance(prompt, str)]
        order = ShardOrder([tokenized[k] for k in plan.order] + untokenized, prompts, plan.num_distinct_tokens,
                           adapters, plan.waves if isinstance(plan, WavePlan) else [])
        self._orders[id(work)] = order
        self.num_prefill_lower_bound += order.num_prefill_lower_bound
        work.num_prefill_lower_bound = order.num_prefill_lower_bound   # recorded with the shard's usage
        return order

    def _plan(self, prompts: list[array | str], adapters: list[str | None] | None,
              indices: list[int]) -> PrefixPlan | WavePlan:
        """The order of the rows at these todo indices (tokenized ones), as positions in
        `indices`: prefix order, or for a LoRA job waves of adapters (engine/lora/waves.py)."""
        if adapters is None:
            return plan_prefix_order([prompts[index] for index in indices])
        return plan_wave_order([prompts[index] for index in indices], [adapters[index] for index in indices],
                               self.llm.max_loras, running=self._running_adapters)

    def _start_waves(self, order: ShardOrder, begin: int, end: int) -> None:
        """Before the rows at order positions begin..end-1 are queued: each wave starting among
        them is the running one now, and the engine starts reading the next wave's adapters."""
        for index, wave in enumerate(order.waves):
            if begin <= wave.start < end:
                self._running_adapters = wave.adapters
                if index + 1 < len(order.waves):
                    self.llm.prefetch_adapters(list(order.waves[index + 1].adapters))

    def step(self) -> list[ShardWork]:
        """One engine step; the shards that got outputs from it."""
        touched = {}
        for finished in self.llm.step():
            work, index = self._requests.pop(finished.request_id)
            work.put(index, finished.output)
            touched[id(work)] = work
        return list(touched.values())

    def abort(self, work: ShardWork) -> None:
        """Drop a shard's requests (its claim is gone or it failed); frees their KV blocks."""
        self._orders.pop(id(work), None)
        for request_id, (owner, _) in list(self._requests.items()):
            if owner is work:
                self.llm.abort(request_id)
                del self._requests[request_id]

    def abort_all(self) -> list[ShardWork]:
        """After a failed step: drop every request; the shards that had some."""
        works = {id(work): work for work, _ in self._requests.values()}
        for request_id in self._requests:
            self.llm.abort(request_id)
        self._requests.clear()
        self._orders.clear()
        return list(works.values())
