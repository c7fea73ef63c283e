"""run_shard: read → infer → write → commit, for one shard under one attempt token."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import pyarrow as pa

from jobs.events import shard_events
from jobs.records import JobRecord
from jobs.store import ShardClaim
from queueing.results import build_table
from queueing.routing import CONTROL_QUEUE
from queueing.runtime import Runtime
from storage.manifest import decode_schema
from storage.plan import ShardPlan
from storage.read import read_shard
from storage.write import PartInfo, part_name, write_part

log = logging.getLogger("barge.worker")

MAX_SHARD_ATTEMPTS = 3
RETRY_BASE_S = 2.0


@dataclass(frozen=True)
class ShardOutcome:
    is_committed: bool           # False: the shard was finished, cancelled or taken over
    num_rows: int = 0
    rows_failed: int = 0
    retry_in_s: float | None = None   # set when the shard was released for another attempt


def run_shard(runtime: Runtime, job_id: str, shard_index: int) -> ShardOutcome:
    store = runtime.store
    claim = store.claim_shard(job_id, shard_index)
    if claim is None:
        log.info("job %s shard %d: nothing to do (finished, cancelled or job not running)", job_id, shard_index)
        return ShardOutcome(is_committed=False)
    job = store.get_job(job_id)
    try:
        part, outputs = _read_infer_write(runtime, job, claim)
    except Exception as exc:   # not a bad row (those are data): the shard itself failed
        return _handle_failure(runtime, job_id, shard_index, claim, exc)

    rows_failed = sum(out.error is not None for out in outputs)
    is_committed, job_is_ready = store.commit_shard(
        job_id, shard_index, claim.token, part=dataclasses.asdict(part),
        rows_succeeded=len(outputs) - rows_failed, rows_failed=rows_failed, events=shard_events(job))
    if not is_committed:
        log.warning("job %s shard %d: attempt %d lost its claim; its part is not committed",
                    job_id, shard_index, claim.attempt)
    if job_is_ready:
        runtime.send("barge.finalize_job", [job_id], CONTROL_QUEUE)
    return ShardOutcome(is_committed=is_committed, num_rows=len(outputs), rows_failed=rows_failed)


def _read_infer_write(runtime: Runtime, job: JobRecord, claim: ShardClaim) -> tuple[PartInfo, list]:
    shard = shard_plan(claim.plan)
    ids, inputs = read_rows(job, shard, claim.plan["global_row_start"])
    engine = runtime.engine_for(job.model_key, job.spec.mode)
    outputs = engine.encode(inputs, **job.spec.params)
    schema = decode_schema(job.output_schema)
    dim = job.spec.params.get("dimensions") or engine.embedding_dim
    table = build_table(job.spec.mode, ids, outputs, id_column=job.spec.id_column, embedding_dim=dim).cast(schema)
    return write_part(job.spec.output, part_name(shard), table), outputs


def _handle_failure(runtime: Runtime, job_id: str, shard_index: int, claim: ShardClaim,
                    exc: Exception) -> ShardOutcome:
    error = f"{type(exc).__name__}: {exc}"
    store = runtime.store
    if claim.attempt < MAX_SHARD_ATTEMPTS:
        log.warning("job %s shard %d attempt %d failed, will retry: %s", job_id, shard_index, claim.attempt, error)
        store.release_shard(job_id, shard_index, claim.token, error)
        return ShardOutcome(is_committed=False, retry_in_s=RETRY_BASE_S * 2 ** (claim.attempt - 1))
    log.error("job %s shard %d failed on all %d attempts: %s", job_id, shard_index, claim.attempt, error)
    _, job_is_ready = store.fail_shard(job_id, shard_index, claim.token, error)
    if job_is_ready:
        runtime.send("barge.finalize_job", [job_id], CONTROL_QUEUE)
    return ShardOutcome(is_committed=False)


def shard_plan(plan: dict) -> ShardPlan:
    names = {field.name for field in dataclasses.fields(ShardPlan)}
    values = {name: plan[name] for name in names}
    values["row_groups"] = tuple(values["row_groups"])
    return ShardPlan(**values)


def read_rows(job: JobRecord, shard: ShardPlan, global_row_start: int) -> tuple[pa.Array, list]:
    """The shard's ids (the job's id column, or global row indices) and input values."""
    spec = job.spec
    columns = [spec.input_column] + ([spec.id_column] if spec.id_column else [])
    batches = list(read_shard(shard, columns))
    inputs = [value for batch in batches for value in batch.column(spec.input_column).to_pylist()]
    if spec.id_column:
        chunks = [batch.column(spec.id_column) for batch in batches]
        ids = pa.concat_arrays(chunks) if chunks else pa.array([], type=pa.int64())
    else:
        ids = pa.array(range(global_row_start, global_row_start + len(inputs)), type=pa.int64())
    return ids, inputs
