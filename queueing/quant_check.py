"""A job's FP8 check on its own rows (JobSpec.quant_check_rows).

On the job's shard 0, before its rows go to the FP8 engine, the first quant_check_rows
rows also run through the unquantized model (the worker's own 16-bit engine if it
keeps one, else one loaded for the check and dropped after), and the comparison
(engine.quant.compare) is stored with the job: `barge report` and the manifest's stats
show it. A check that cannot run records its error; the job's rows do not depend on it.

NOTE: engines are not thread-safe. With the shard pipeline, the engine thread may be
computing another shard on the same FP8 engine, so the check waits until the pipeline
is idle: once per job, the cost of one shard's overlap.
"""

from __future__ import annotations

import gc
import logging

from jobs.records import JobRecord
from jobs.row_params import shared_params
from queueing.runtime import EngineKey, Runtime

log = logging.getLogger("barge.worker")


def wants_quant_check(runtime: Runtime, job: JobRecord, shard_index: int) -> bool:
    """Shard 0 of a job that asked for a check, unless an earlier attempt recorded one."""
    spec = job.spec
    return (shard_index == 0 and spec.quantization is not None and spec.quant_check_rows > 0
            and runtime.store.quant_check(job.id) is None)


def run_quant_check(runtime: Runtime, job: JobRecord, inputs: list) -> dict:
    """Compare the FP8 engine with the unquantized one on inputs[:quant_check_rows]; store
    and return the figures (or {"error": ...})."""
    spec = job.spec
    if runtime.pipeline is not None:
        runtime.pipeline.wait_idle()
    try:
        check = _compare(runtime, job, inputs[:spec.quant_check_rows])
    except Exception as exc:   # a measurement, not the job's work: record why and go on
        log.warning("job %s: the FP8 check failed: %s", job.id, exc)
        check = {"error": f"{type(exc).__name__}: {exc}"}
    else:
        log.info("job %s: FP8 check %s", job.id, check)
    runtime.store.record_quant_check(job.id, check)
    return check


def _compare(runtime: Runtime, job: JobRecord, rows: list) -> dict:
    from engine.quant.compare import compare   # torch: only in model-serving processes
    key = EngineKey.for_job(job)
    fp8 = runtime.engine_for(key)
    baseline = runtime.engines.get(key.baseline)
    is_loaded_for_check = baseline is None
    if is_loaded_for_check:
        baseline = runtime.load_engine(key.baseline)
    try:
        return compare(baseline, fp8, rows, shared_params(job.spec.params)).to_dict()   # without a per-row column
    finally:
        if is_loaded_for_check:
            del baseline
            _free_memory()


def _free_memory() -> None:
    """Give the dropped baseline's memory back (on a GPU, to the FP8 engine and its KV cache)."""
    gc.collect()
    import torch
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
