"""run_shard: claim → read → infer (in chunks, under a lease) → write → commit.

The phases are separate functions (begin_shard, infer_rows, end_shard) so that
queueing.pipeline can run them for several shards at once: reading the next shard
while the engine computes this one, and one engine call over the last rows of a shard
and the first of the next.

Between engine calls the worker checks that it still holds the shard (a cancelled or
expired job, or a reclaimed lease, ends the attempt within seconds, committing
nothing) and whether it is draining past its grace period (then it releases the shard
for another worker)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from dataclasses import dataclass, field

import pyarrow as pa

from jobs.cache_reach import CacheReach
from jobs.events import shard_events
from jobs.generate_usage import GenerateUsage
from jobs.records import JobRecord
from jobs.row_params import row_adapters
from jobs.store import ShardClaim
from queueing.devices import EXIT_DEVICE_FAULT, is_device_fault
from jobs.failpoints import crash_if_poisoned, failpoint, hang_if_poisoned
from queueing.inference import infer
from queueing.lease import LeaseKeeper
from queueing.quant_check import run_quant_check, wants_quant_check
from queueing.result_cache import CachedRows, CacheWrite, ResultCache, merge_cached
from queueing.results import ROW_INDEX_COLUMN, build_table
from jobs.messaging import CONTROL_QUEUE
from queueing.runtime import EngineKey, Runtime
from jobs.transient import is_transient, retrying
from queueing.shard_rows import read_rows, with_row_errors
from queueing.usage import ShardUsage, generate_usage, shard_usage
from storage.manifest import decode_schema
from storage.plan import ShardPlan
from storage.write import PartInfo, part_name, write_part

log = logging.getLogger("barge.worker")

RETRY_BASE_S = 2.0
TRANSIENT_RETRY_DELAY_S = 10.0   # a shard that met an outage is sent again this much later


class AttemptStopped(Exception):
    """The attempt ended before its commit: `reason` is "lost" or "draining"."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ShardOutcome:
    status: str          # committed | dropped | lost | released | retrying | failed
    num_rows: int = 0
    rows_failed: int = 0
    usage: ShardUsage | None = None   # committed: what the shard processed (metrics)


def run_shard(runtime: Runtime, job_id: str, shard_index: int) -> ShardOutcome:
    """The whole attempt in the calling thread (queueing.pipeline overlaps attempts)."""
    started = begin_shard(runtime, job_id, shard_index)
    if isinstance(started, ShardOutcome):
        return started
    return continue_shard(runtime, started)


def continue_shard(runtime: Runtime, work: "ShardWork") -> ShardOutcome:
    """Infer, write and commit a begun shard in the calling thread."""
    try:
        while not work.is_fed:
            check_still_held(runtime, work)
            infer_rows(runtime, [(work, work.take(runtime.options.chunk_rows))])
    except AttemptStopped as stop:
        return end_stopped(runtime, work, stop.reason)
    except Exception as exc:   # not a bad row (those are data): the shard itself failed
        return end_failed(runtime, work, exc)
    return end_shard(runtime, work)


@dataclass
class ShardWork:
    """One claimed shard between its read and its commit."""

    job: JobRecord
    claim: ShardClaim
    lease: LeaseKeeper                  # renewing since the claim; closed when the attempt ends
    shard: ShardPlan
    ids: pa.Array                       # every row's id, in input order
    inputs: list                        # every row's input value
    carried: dict                       # output columns copied from the input
    input_errors: dict = field(default_factory=dict)   # row -> error, for rows that cannot be computed (null id, ...)
    cache: ResultCache | None = None    # incremental jobs
    cached: CachedRows | None = None    # the rows found in the cache
    todo: list[int] = field(default_factory=list)      # rows the engine computes, in order
    outputs: list = field(default_factory=list)        # the engine's outputs for todo[:len(outputs)]
    fed: int = 0                                       # rows of todo handed to the engine
    started_at: float = field(default_factory=time.monotonic)
    early: dict = field(default_factory=dict)          # todo index -> output that finished before earlier rows
    row_params: list | None = None                     # row -> its params over the job's (jobs.row_params)
    num_prefill_lower_bound: int | None = None         # generate: distinct prefix tokens of the prompts (the feed's
                                                       # order, or summed over engine.generate calls); None: unknown

    @property
    def shard_index(self) -> int:
        return self.shard.shard_index

    @property
    def is_fed(self) -> bool:
        return self.fed >= len(self.todo)

    @property
    def is_done(self) -> bool:
        return len(self.outputs) >= len(self.todo)

    def take(self, max_rows: int) -> list[int]:
        """The next rows (positions in the shard) to hand to the engine."""
        rows = self.todo[self.fed:self.fed + max_rows]
        self.fed += len(rows)
        return rows

    def put(self, index: int, output) -> None:
        """The output of todo[index], which may come before the outputs of earlier rows
        (generate finishes short outputs first: queueing.generate_feed)."""
        self.early[index] = output
        while len(self.outputs) in self.early:
            self.outputs.append(self.early.pop(len(self.outputs)))

    @functools.cached_property
    def todo_adapters(self) -> list[str | None] | None:
        """Each todo row's LoRA adapter (None: the base model), or None for a job without
        adapters: worked out once, for the feed's order, its requests and the shard's usage."""
        if not EngineKey.for_job(self.job).lora:
            return None
        overrides = [self.row_params[row] for row in self.todo] if self.row_params else None
        return row_adapters(self.job.spec.adapter, overrides, len(self.todo)) or [None] * len(self.todo)

    def can_share_batch(self, other: "ShardWork") -> bool:
        """Rows of one job share an engine call (same model, mode, params and quantization:
        an FP8 job's rows never go through a 16-bit job's engine, nor the reverse)."""
        return self.job.id == other.job.id


def begin_shard(runtime: Runtime, job_id: str, shard_index: int) -> "ShardWork | ShardOutcome":
    """Claim the shard, start its lease, read its rows and look them up in the results
    cache; or the outcome that ended the attempt before any engine work."""
    store, options = runtime.store, runtime.options
    if runtime.drain_deadline is not None:   # draining: leave it on the queue's next reader
        runtime.send_shards(store.get_job(job_id), [shard_index])
        return ShardOutcome("released")
    fetch_error = _fetch_model(runtime, job_id)
    claim = store.claim_shard(job_id, shard_index, worker_id=runtime.worker_id, lease_s=options.lease_s)
    if claim is None:
        log.info("job %s shard %d: dropped (finished, held by a live worker, or job not running)", job_id, shard_index)
        return ShardOutcome("dropped")
    job = store.get_job(job_id)
    lease = LeaseKeeper(store, job_id, shard_index, claim.token, options.lease_s).start()
    if claim.attempt > 1 and runtime.pipeline is not None:
        # A retried shard may be what crashed the worker last time: it runs alone (see
        # queueing.pipeline), so another crash costs no other shard an attempt.
        runtime.pipeline.wait_idle()
    work = ShardWork(job, claim, lease, ShardPlan.from_dict(claim.plan), pa.array([]), [], {})
    if fetch_error is not None:   # the attempt fails with the reason: retried, then dead-lettered
        return end_failed(runtime, work, fetch_error)
    try:
        rows = read_rows(job, work.shard)
        work.ids, work.inputs, work.carried, work.input_errors = rows.ids, rows.inputs, rows.carried, rows.errors
        work.row_params = rows.row_params
        crash_if_poisoned(work.inputs)
        work.cache = _result_cache(runtime, job, decode_schema(job.output_schema), work.carried)
        work.cached = work.cache.lookup(work.ids, work.inputs, shard_index) if work.cache else None
        work.todo = work.cached.miss_rows(len(work.inputs)) if work.cached else list(range(len(work.inputs)))
        if work.cached and work.cached.num_unreadable:
            runtime.metrics.cache_unreadable.inc(work.cached.num_unreadable)
    except Exception as exc:
        return end_failed(runtime, work, exc)
    if wants_quant_check(runtime, job, shard_index):
        run_quant_check(runtime, job, work.inputs)
    return work


def _fetch_model(runtime: Runtime, job_id: str) -> Exception | None:
    """A Hub model's commit is fetched before the claim, so no lease runs out over a
    download (Runtime.fetch_model); a failure is returned, to fail the claimed attempt."""
    if not runtime.serves_hub_models:
        return None
    try:
        runtime.fetch_model(runtime.store.get_job(job_id))
    except Exception as exc:  # noqa: BLE001 - the attempt fails with it once claimed
        log.warning("job %s: its model cannot be fetched on this worker: %s", job_id, exc)
        return exc
    return None


def check_still_held(runtime: Runtime, work: ShardWork) -> None:
    if work.lease.is_lost:
        raise AttemptStopped("lost")
    if runtime.is_past_drain_deadline:
        raise AttemptStopped("draining")


def infer_rows(runtime: Runtime, batch: list[tuple[ShardWork, list[int]]]) -> None:
    """One engine call over rows of one or more shards of one job; each shard gets its
    outputs appended in order. Raises what the engine raises (the shards fail)."""
    first = batch[0][0]
    ids = pa.concat_arrays([work.ids.take(pa.array(rows, type=pa.int64())) for work, rows in batch])
    inputs = [work.inputs[i] for work, rows in batch for i in rows]
    row_params = ([work.row_params[i] if work.row_params else {} for work, rows in batch for i in rows]
                  if any(work.row_params for work, _ in batch) else None)
    engine = runtime.engine_for(EngineKey.for_job(first.job))
    with runtime.watch.busy(f"{first.job.spec.mode} of {len(inputs)} rows of job {first.job.id}", engine):
        hang_if_poisoned(inputs)
        outputs = infer(engine, first.job, ids, inputs, row_params)
    if first.job.spec.mode == "generate" and len(batch) == 1:   # the synchronous path (the pipeline's go to the feed)
        first.num_prefill_lower_bound = ((first.num_prefill_lower_bound or 0)
                                         + engine.llm.last_run.num_prefill_lower_bound)
    start = 0
    for work, rows in batch:
        work.outputs.extend(outputs[start:start + len(rows)])
        start += len(rows)


def end_shard(runtime: Runtime, work: ShardWork) -> ShardOutcome:
    """Every row is done: write the part, commit it, close the lease."""
    try:
        written = _write(runtime, work)
    except Exception as exc:
        return end_failed(runtime, work, exc)
    work.lease.close()   # the commit itself is fenced by the claim's token
    return _commit(runtime, work.job, work.shard_index, work.claim, written)


def end_stopped(runtime: Runtime, work: ShardWork, reason: str) -> ShardOutcome:
    work.lease.close()
    return _stopped(runtime, work.job, work.shard_index, work.claim, reason)


def end_failed(runtime: Runtime, work: ShardWork, exc: Exception) -> ShardOutcome:
    exit_if_device_fault(exc)
    work.lease.close()
    return _handle_failure(runtime, work.job, work.shard_index, work.claim, exc)


def exit_if_device_fault(exc: Exception) -> None:
    """A GPU fault poisons this process's CUDA context: the process ends at once (its
    shards come back through their leases) and its supervisor starts a fresh one."""
    if is_device_fault(exc):
        log.critical("GPU fault, this engine process exits for its supervisor to restart it: %s", exc)
        logging.shutdown()
        os._exit(EXIT_DEVICE_FAULT)


@dataclass(frozen=True)
class ShardWritten:
    part: PartInfo
    outputs: list                       # the engine's outputs: rows it computed
    rows_reused: int = 0                # incremental: rows taken from the results cache
    cache: ResultCache | None = None
    cache_write: CacheWrite | None = None   # indexed once the part is committed
    generate: GenerateUsage | None = None   # generate: prefill and rows per adapter (queueing.usage)


def _write(runtime: Runtime, work: ShardWork) -> ShardWritten:
    job, cached = work.job, work.cached
    schema = decode_schema(job.output_schema)
    miss_ids = work.ids.take(pa.array(work.todo, type=pa.int64()))
    table = build_table(job.spec.mode, miss_ids, work.outputs, id_column=job.spec.id_column, schema=schema)
    cache_write = None
    if work.cache:
        cache_write = work.cache.save(work.shard_index, work.claim.attempt, [cached.keys[i] for i in work.todo],
                                      table, cached)
        table = merge_cached(table, cached, work.ids, job.spec.id_column or ROW_INDEX_COLUMN)
    table = with_row_errors(table, work.input_errors)
    for name, column in work.carried.items():
        table = table.append_column(name, column)
    table = table.select(schema.names).cast(schema)
    part = write_part(job.spec.output, part_name(work.shard), table)
    generate = (generate_usage(work.outputs, work.todo_adapters, work.num_prefill_lower_bound)
                if job.spec.mode == "generate" else None)
    return ShardWritten(part, work.outputs, cached.num_hits if cached else 0, work.cache, cache_write, generate)


def _result_cache(runtime: Runtime, job: JobRecord, schema: pa.Schema, carried: dict) -> ResultCache | None:
    if not job.spec.incremental or not job.cache_namespace:
        return None
    id_name = job.spec.id_column or ROW_INDEX_COLUMN
    result_columns = [n for n in schema.names if n not in (id_name, "error") and n not in carried]
    return ResultCache(runtime.store, runtime.settings.cache_url, job, result_columns, CacheReach(runtime.settings))


def _commit(runtime: Runtime, job: JobRecord, shard_index: int, claim: ShardClaim,
            written: ShardWritten) -> ShardOutcome:
    outputs = written.outputs
    usage = shard_usage(job.model_key, job.spec.mode, outputs, runtime.engine_settings(EngineKey.for_job(job)),
                        written.generate)
    rows_failed = usage.rows_failed

    def commit() -> tuple[bool, bool]:
        return runtime.store.commit_shard(
            job.id, shard_index, claim.token, part=dataclasses.asdict(written.part),
            rows_succeeded=len(outputs) - rows_failed + written.rows_reused, rows_failed=rows_failed,
            events=shard_events(job), num_tokens=usage.num_tokens, engine=usage.engine,
            rows_reused=written.rows_reused, generate_usage=usage.generate)

    # Fenced by the claim's token, so retrying through an outage cannot commit twice (a
    # commit whose answer was lost reads as "lost" here; the job's owner then finalizes
    # it). Past the retries the lease lapses and another attempt rewrites the same part.
    is_committed, job_is_ready = retrying(f"job {job.id} shard {shard_index}: commit", commit,
                                          within_s=runtime.options.transient_retry_s)
    if not is_committed:
        log.warning("job %s shard %d: attempt %d lost its claim; its part is not committed",
                    job.id, shard_index, claim.attempt)
        return ShardOutcome("lost")
    if written.cache_write is not None:
        written.cache.register(written.cache_write)
    failpoint("after_shard_commit_before_send")
    _after_finish(runtime, job.id, job_is_ready)
    return ShardOutcome("committed", num_rows=len(outputs) + written.rows_reused, rows_failed=rows_failed,
                        usage=usage)


def _stopped(runtime: Runtime, job: JobRecord, shard_index: int, claim: ShardClaim, reason: str) -> ShardOutcome:
    if reason == "lost":
        log.info("job %s shard %d: stopped, the claim is gone", job.id, shard_index)
        return ShardOutcome("lost")
    log.info("job %s shard %d: draining past the grace period, releasing it", job.id, shard_index)
    if runtime.store.release_shard(job.id, shard_index, claim.token, None):
        runtime.send_shards(job, [shard_index])
    return ShardOutcome("released")


def _handle_failure(runtime: Runtime, job: JobRecord, shard_index: int, claim: ShardClaim,
                    exc: Exception) -> ShardOutcome:
    error = f"{type(exc).__name__}: {exc}"
    store = runtime.store
    if is_transient(exc):   # an outage, not the shard: retried, never dead-lettered for it
        log.warning("job %s shard %d attempt %d met a transient error, will retry (not counted): %s", job.id,
                    shard_index, claim.attempt, error)
        if store.release_shard(job.id, shard_index, claim.token, error, counts_as_attempt=False):
            runtime.send_shards(job, [shard_index], countdown=TRANSIENT_RETRY_DELAY_S)
        return ShardOutcome("retrying")
    if claim.attempt < runtime.options.max_attempts:
        log.warning("job %s shard %d attempt %d failed, will retry: %s", job.id, shard_index, claim.attempt, error)
        if store.release_shard(job.id, shard_index, claim.token, error):
            runtime.send_shards(job, [shard_index], countdown=RETRY_BASE_S * 2 ** (claim.attempt - 1))
        return ShardOutcome("retrying")
    log.error("job %s shard %d dead-lettered after %d attempts: %s", job.id, shard_index, claim.attempt, error)
    _, job_is_ready = store.fail_shard(job.id, shard_index, claim.token,
                                       f"dead-lettered after {claim.attempt} attempts: {error}")
    _after_finish(runtime, job.id, job_is_ready)
    return ShardOutcome("failed")


def _after_finish(runtime: Runtime, job_id: str, job_is_ready: bool) -> None:
    if job_is_ready:
        runtime.send("barge.finalize_job", [job_id], CONTROL_QUEUE)
    else:
        runtime.refill_window(job_id)
