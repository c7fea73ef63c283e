"""run_shard: claim → read → infer (in chunks, under a lease) → write → commit.

Between engine calls the worker checks that it still holds the shard (a cancelled or
expired job, or a reclaimed lease, ends the attempt within seconds, committing
nothing) and whether it is draining past its grace period (then it releases the shard
for another worker)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import pyarrow as pa

from jobs.events import shard_events
from jobs.records import JobRecord
from jobs.store import ShardClaim
from queueing.failpoints import crash_if_poisoned
from queueing.inference import infer
from queueing.lease import LeaseKeeper
from queueing.result_cache import CacheWrite, ResultCache, merge_cached
from queueing.results import ROW_INDEX_COLUMN, build_table
from queueing.routing import CONTROL_QUEUE
from queueing.runtime import Runtime
from queueing.usage import ShardUsage, shard_usage
from storage.manifest import decode_schema
from storage.plan import ShardPlan
from storage.read import read_shard
from storage.write import PartInfo, part_name, write_part

log = logging.getLogger("barge.worker")

RETRY_BASE_S = 2.0


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
    store, options = runtime.store, runtime.options
    if runtime.drain_deadline is not None:   # draining: leave it on the queue's next reader
        runtime.send_shards(store.get_job(job_id), [shard_index])
        return ShardOutcome("released")
    claim = store.claim_shard(job_id, shard_index, worker_id=runtime.worker_id, lease_s=options.lease_s)
    if claim is None:
        log.info("job %s shard %d: dropped (finished, held by a live worker, or job not running)", job_id, shard_index)
        return ShardOutcome("dropped")
    job = store.get_job(job_id)
    try:
        with LeaseKeeper(store, job_id, shard_index, claim.token, options.lease_s) as lease:
            written = _read_infer_write(runtime, job, claim, lease)
    except AttemptStopped as stop:
        return _stopped(runtime, job, shard_index, claim, stop.reason)
    except Exception as exc:   # not a bad row (those are data): the shard itself failed
        return _handle_failure(runtime, job, shard_index, claim, exc)
    return _commit(runtime, job, shard_index, claim, written)


@dataclass(frozen=True)
class ShardWritten:
    part: PartInfo
    outputs: list                       # the engine's outputs: rows it computed
    rows_reused: int = 0                # incremental: rows taken from the results cache
    cache: ResultCache | None = None
    cache_write: CacheWrite | None = None   # indexed once the part is committed


def _read_infer_write(runtime: Runtime, job: JobRecord, claim: ShardClaim, lease: LeaseKeeper) -> ShardWritten:
    shard = shard_plan(claim.plan)
    ids, inputs, carried = read_rows(job, shard, claim.plan["global_row_start"])
    crash_if_poisoned(inputs)
    schema = decode_schema(job.output_schema)
    cache = _result_cache(runtime, job, schema, carried)
    cached = cache.lookup(ids, inputs) if cache else None
    misses = cached.miss_rows(len(inputs)) if cached else range(len(inputs))
    miss_ids = ids.take(pa.array(misses, type=pa.int64())) if cached else ids
    outputs = _infer_chunks(runtime, job, lease, miss_ids, [inputs[i] for i in misses])
    id_name = job.spec.id_column or ROW_INDEX_COLUMN
    table = build_table(job.spec.mode, miss_ids, outputs, id_column=job.spec.id_column, schema=schema)
    cache_write = cache.save(shard.shard_index, claim.attempt, [cached.keys[i] for i in misses], table, cached) \
        if cache else None
    if cached:
        table = merge_cached(table, cached, ids, id_name)
    for name, column in carried.items():
        table = table.append_column(name, column)
    table = table.select(schema.names).cast(schema)
    part = write_part(job.spec.output, part_name(shard), table)
    return ShardWritten(part, outputs, cached.num_hits if cached else 0, cache, cache_write)


def _infer_chunks(runtime: Runtime, job: JobRecord, lease: LeaseKeeper, ids: pa.Array, inputs: list) -> list:
    engine = runtime.engine_for(job.model_key, job.spec.mode) if inputs else None
    outputs, chunk_rows = [], runtime.options.chunk_rows
    for start in range(0, len(inputs), chunk_rows):
        if lease.is_lost:
            raise AttemptStopped("lost")
        if runtime.is_past_drain_deadline:
            raise AttemptStopped("draining")
        outputs.extend(infer(engine, job, ids[start:start + chunk_rows], inputs[start:start + chunk_rows]))
    return outputs


def _result_cache(runtime: Runtime, job: JobRecord, schema: pa.Schema, carried: dict) -> ResultCache | None:
    if not job.spec.incremental or not job.cache_namespace:
        return None
    id_name = job.spec.id_column or ROW_INDEX_COLUMN
    result_columns = [n for n in schema.names if n not in (id_name, "error") and n not in carried]
    return ResultCache(runtime.store, runtime.settings.cache_url, job, result_columns)


def _commit(runtime: Runtime, job: JobRecord, shard_index: int, claim: ShardClaim,
            written: ShardWritten) -> ShardOutcome:
    outputs = written.outputs
    usage = shard_usage(job.model_key, job.spec.mode, outputs, runtime.engine_settings(job.model_key, job.spec.mode))
    rows_failed = usage.rows_failed
    is_committed, job_is_ready = runtime.store.commit_shard(
        job.id, shard_index, claim.token, part=dataclasses.asdict(written.part),
        rows_succeeded=len(outputs) - rows_failed + written.rows_reused, rows_failed=rows_failed,
        events=shard_events(job), num_tokens=usage.num_tokens, engine=usage.engine, rows_reused=written.rows_reused)
    if not is_committed:
        log.warning("job %s shard %d: attempt %d lost its claim; its part is not committed",
                    job.id, shard_index, claim.attempt)
        return ShardOutcome("lost")
    if written.cache_write is not None:
        written.cache.register(written.cache_write)
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


def shard_plan(plan: dict) -> ShardPlan:
    names = {field.name for field in dataclasses.fields(ShardPlan)}
    values = {name: plan[name] for name in names if name in plan}
    values["row_groups"] = tuple(values["row_groups"])
    return ShardPlan(**values)


def read_rows(job: JobRecord, shard: ShardPlan, global_row_start: int) -> tuple[pa.Array, list, dict]:
    """The shard's ids (the job's id column, or global row indices), input values, and
    the columns carried into the output (carried columns, then partition keys)."""
    spec = job.spec
    columns = [spec.input_column] + ([spec.id_column] if spec.id_column else []) + list(spec.carry_columns)
    table = pa.Table.from_batches(list(read_shard(shard, columns, partition_columns=spec.partition_columns)))
    inputs = table.column(spec.input_column).to_pylist()
    if spec.id_column:
        ids = table.column(spec.id_column).combine_chunks()
    else:
        ids = pa.array(range(global_row_start, global_row_start + len(inputs)), type=pa.int64())
    carried_names = list(spec.carry_columns) + (list(shard.partition) if spec.partition_columns else [])
    return ids, inputs, {name: table.column(name) for name in carried_names}
