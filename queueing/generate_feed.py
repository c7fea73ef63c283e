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
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from engine.generate.outputs import error_output
from queueing.inference import row_sampling_params
from queueing.runtime import EngineKey
from queueing.worker import ShardWork

if TYPE_CHECKING:
    from engine.engine import Engine


class GenerateFeed:
    """Talks to the engine through LLMEngine's streaming API only: add_requests, step, abort."""

    def __init__(self, engine: Engine, key: EngineKey):
        self.engine = engine            # mode "generate"
        self.llm = engine.llm
        self.key = key                  # the engine's: an FP8 job's rows never join a 16-bit engine's batch,
                                        # nor an fp8-KV job's rows a 16-bit cache's, or the reverse
        self._requests: dict[int, tuple[ShardWork, int]] = {}   # request id -> (its shard, its row's todo index)

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
        """Queue `rows` (positions in the shard) as requests; todo index of rows[0] is
        `first_index`. A row that cannot run (empty, too long) gets its error at once;
        bad sampling parameters raise ValueError (the shard fails, as with generate())."""
        ids = work.ids.take(pa.array(rows, type=pa.int64()))
        row_params = [work.row_params[row] for row in rows] if work.row_params else None
        params = row_sampling_params(work.job.spec.params, ids, row_params)
        prompts = [work.inputs[row] for row in rows]
        for offset, request_id in enumerate(self.llm.add_requests(prompts, params)):
            if isinstance(request_id, str):     # why the row cannot run
                work.put(first_index + offset, error_output(request_id))
            else:
                self._requests[request_id] = (work, first_index + offset)

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
        return list(works.values())
