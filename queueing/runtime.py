"""What one worker process holds between tasks: settings, the store, loaded engines,
its knobs, and whether it is draining."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field

from celery import Celery

from jobs.hub_models import is_hub_key, queue_key
from jobs.models import ModelRef, resolve_model
from jobs.records import JobRecord
from jobs.settings import Settings
from jobs.store import Store
from queueing.devices import DeviceSlot
from queueing.metrics import WorkerMetrics
from queueing.routing import model_queue, queue_name
from queueing.stall import EngineWatch
from queueing.usage import engine_settings

log = logging.getLogger("barge.worker")

# (model key, mode, quantization), and after them the dtype (embed) or the KV cache dtype (generate) where a
# job names one: one loaded engine each
EngineKey = tuple[str, ...]


@dataclass(frozen=True)
class WorkerOptions:
    lease_s: float = 60.0           # a shard's lease; renewed every lease_s / 4 while it runs
    max_attempts: int = 3           # attempts (failures or lost leases) before a shard is dead-lettered
    job_window: int = 4             # shards of one job on the broker at once (fair sharing)
    drain_grace_s: float = 30.0     # after SIGTERM: finish the current shard within this, else release it
    housekeeping_s: float = 2.0     # how often leases are reclaimed and windows refilled
    requeue_after_s: float = 600.0  # a sent shard nobody claimed for this long is sent again; so is an owed
                                    # partial manifest's task, and a stranded job's plan or finalize
                                    # (queueing.housekeeping)
    chunk_rows: int = 256           # rows per engine call; between calls the worker checks its claim
    kv_cache_fraction: float | None = None   # generate: share of free memory for the KV cache (engine default 0.3);
                                             # on a GPU only when gpu_memory_fraction is not set (the old setting)
    gpu_memory_fraction: float | None = None   # generate on a GPU: the device share for weights, activations and
                                               # KV cache (engine.gpu_memory; engine default 0.9)
    metrics_port: int = 0           # serve Prometheus metrics on this port; 0: off (queueing.metrics)
    metrics_addr: str = "0.0.0.0"   # the address the metrics server binds
    pipeline_depth: int = 1         # shards read ahead while the engine computes (queueing.pipeline); 0: none
    transient_retry_s: float = 60.0  # a plan or finalize retries a transient error this long, then leaves the
                                     # job to its owner (queueing.finalize.run_job_step)
    tidy_s: float = 600.0           # how often the housekeeper also looks for leftovers (queueing.housekeeping.tidy)
    staging_retention_s: float = 7 * 86_400.0   # a job that ended unfinished keeps its staged files this long

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "WorkerOptions":
        env = os.environ if env is None else env
        names = {"lease_s": "BARGE_LEASE_S", "max_attempts": "BARGE_MAX_ATTEMPTS", "job_window": "BARGE_JOB_WINDOW",
                 "drain_grace_s": "BARGE_DRAIN_GRACE_S", "housekeeping_s": "BARGE_HOUSEKEEPING_S",
                 "requeue_after_s": "BARGE_REQUEUE_AFTER_S", "chunk_rows": "BARGE_CHUNK_ROWS",
                 "metrics_port": "BARGE_METRICS_PORT", "metrics_addr": "BARGE_METRICS_ADDR",
                 "kv_cache_fraction": "BARGE_KV_CACHE_FRACTION", "pipeline_depth": "BARGE_PIPELINE_DEPTH",
                 "transient_retry_s": "BARGE_TRANSIENT_RETRY_S", "gpu_memory_fraction": "BARGE_GPU_MEMORY_FRACTION",
                 "tidy_s": "BARGE_TIDY_S", "staging_retention_s": "BARGE_STAGING_RETENTION_S"}
        values = {}
        for name, variable in names.items():
            if env.get(variable):
                kind = float if name in ("kv_cache_fraction", "gpu_memory_fraction") else type(getattr(cls, name))
                try:
                    values[name] = kind(env[variable])
                except ValueError:
                    raise ValueError(f"{variable}: {env[variable]!r} is not a {kind.__name__}") from None
        return cls(**values)


@dataclass
class Runtime:
    settings: Settings
    store: Store
    app: Celery
    options: WorkerOptions = field(default_factory=WorkerOptions)
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    models: dict[str, ModelRef] = field(default_factory=dict)      # model key -> ref
    engines: dict[EngineKey, object] = field(default_factory=dict)   # (model key, mode, quantization) -> Engine
    metrics: WorkerMetrics = field(default_factory=WorkerMetrics)
    drain_deadline: float | None = None    # set on SIGTERM: monotonic time the current shard must end by
    pipeline: object | None = None         # queueing.pipeline.ShardPipeline when pipeline_depth > 0
    deliveries: object | None = None       # queueing.delivery_pool.DeliveryPool of the worker's Dispatcher
    device: DeviceSlot | None = None       # the slot this process serves (queueing.devices); None: engine default
    watch: EngineWatch = field(default_factory=EngineWatch)   # engine progress; its watchdog runs in `barge worker`
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def engine_for(self, model_key: str, mode: str, quantization: str | None = None, dtype: str | None = None,
                   kv_cache_dtype: str | None = None):
        """The engine for a model this worker serves, loaded once and kept. An FP8 engine
        and the model's 16-bit one are separate engines, each kept once loaded; so is an
        engine of a dtype or a KV cache dtype a job names (JobSpec.dtype, .kv_cache_dtype),
        keyed with it."""
        key = (model_key, mode, quantization, *(named for named in (dtype, kv_cache_dtype) if named is not None))
        with self._lock:
            engine = self.engines.get(key)
            if engine is None:
                with self.watch.busy(f"loading {model_key} for {mode}", loading=True):
                    engine = self._load_engine(model_key, mode, quantization, dtype, kv_cache_dtype)
                self.watch.watch(engine)
                self.metrics.observe_engine(engine, model_key, mode)
                self.engines[key] = engine
            return engine

    def fetch_model(self, job: JobRecord) -> None:
        """A Hub model's commit that this worker has not served yet is fetched (or found in
        the Hub cache) now, before a shard of it is claimed: the job stores the id pinned
        to its commit (jobs.hub_models), and its engine is that commit's alone."""
        if job.model_key in self.models or not is_hub_key(job.model_key):
            return
        if queue_key(job.model_key) not in {queue_key(key) for key in self.models}:
            raise LookupError(f"this worker does not serve model {job.spec.model!r}")
        ref = resolve_model(job.spec.model)
        if ref.key != job.model_key:
            raise LookupError(f"{job.spec.model!r} resolves to {ref.key} on this worker, not {job.model_key}")
        with self._lock:   # a new dict, not an insert: other threads (the heartbeat) iterate the old one
            self.models = {**self.models, ref.key: ref}

    @property
    def serves_hub_models(self) -> bool:
        return any(is_hub_key(key) for key in self.models)

    def load_engine(self, model_key: str, mode: str, quantization: str | None = None):
        """A fresh engine that this runtime does not keep (the unquantized baseline of a
        job's FP8 check): the caller drops it when done."""
        with self._lock, self.watch.busy(f"loading {model_key} for {mode} (a baseline)", loading=True):
            engine = self._load_engine(model_key, mode, quantization)
        self.watch.watch(engine)
        return engine

    def _load_engine(self, model_key: str, mode: str, quantization: str | None, dtype: str | None = None,
                     kv_cache_dtype: str | None = None):
        ref = self.models.get(model_key)
        if ref is None:
            raise LookupError(f"this worker does not serve model {model_key!r}")
        from engine import Engine   # heavy: torch loads only in model-serving processes
        log.info("loading model %s (%s) for %s%s%s", ref.key, ref.path, mode,
                 f", {quantization} weights" if quantization else "",
                 f", {kv_cache_dtype} KV cache" if kv_cache_dtype else "")
        options = {}
        if mode == "generate":
            options.update(self._memory_options())
        if self.device is not None:
            options["device"] = self.device.torch_device
        if dtype is not None:
            options["dtype"] = dtype
        if kv_cache_dtype is not None:
            options["kv_cache_dtype"] = kv_cache_dtype
        engine = Engine.from_pretrained(ref.path, mode=mode, quantization=quantization, **options)
        if self.device is not None:
            engine.device_id = self.device.label
        return engine

    def _memory_options(self) -> dict:
        """GenerateOptions for memory: BARGE_GPU_MEMORY_FRACTION, else the older
        BARGE_KV_CACHE_FRACTION (then a share of free memory on a GPU too, as before)."""
        if self.options.gpu_memory_fraction is not None:
            return {"gpu_memory_fraction": self.options.gpu_memory_fraction}
        if self.options.kv_cache_fraction is not None:
            return {"kv_cache_memory_fraction": self.options.kv_cache_fraction, "gpu_memory_fraction": None}
        return {}

    def engine_settings(self, model_key: str, mode: str, quantization: str | None = None,
                        dtype: str | None = None, kv_cache_dtype: str | None = None) -> dict:
        """The settings of the engine serving this key, as recorded with each commit: read
        afresh each time, since an engine lowers its batch budget after an out-of-memory
        error (engine.oom) and the shards it commits after that record the lower one."""
        return engine_settings(self.engine_for(model_key, mode, quantization, dtype, kv_cache_dtype), model_key)

    def send(self, task_name: str, args: list, queue: str, *, priority: int | None = None,
             countdown: float | None = None) -> None:
        """Send a task to a logical queue (queueing.routing) of this deployment.

        `priority` is Barge's 0 (lowest) .. 9 (highest). RabbitMQ means the same; Redis
        (kombu's priority steps) serves 0 first, so the scale is turned over there."""
        options = {"countdown": countdown} if countdown else {}
        if priority is not None and not self.settings.is_embedded_broker:
            options["priority"] = 9 - priority if self.settings.broker_url.startswith("redis") else priority
        self.app.send_task(task_name, args=args, queue=queue_name(self.settings.namespace, queue), **options)

    def send_shards(self, job: JobRecord, shard_indices: list[int], *, countdown: float | None = None) -> None:
        for shard_index in shard_indices:
            self.send("barge.run_shard", [job.id, shard_index], model_queue(job.model_key),
                      priority=job.spec.priority, countdown=countdown)

    def refill_window(self, job_id: str) -> int:
        """Send the job's next shards so that `job_window` of them are on the broker."""
        free = self.options.job_window - self.store.num_in_flight(job_id)
        indices = self.store.take_unsent(job_id, free) if free > 0 else []
        if indices:
            self.send_shards(self.store.get_job(job_id), indices)
        return len(indices)

    def begin_drain(self) -> None:
        if self.drain_deadline is None:
            self.drain_deadline = time.monotonic() + self.options.drain_grace_s
            log.info("draining: taking no new shards; the current one has %.0fs to finish", self.options.drain_grace_s)

    @property
    def is_past_drain_deadline(self) -> bool:
        return self.drain_deadline is not None and time.monotonic() > self.drain_deadline


def attach_runtime(app: Celery, runtime: Runtime) -> None:
    app.barge_runtime = runtime


def runtime_of(app: Celery) -> Runtime:
    runtime = getattr(app, "barge_runtime", None)
    if runtime is None:
        raise RuntimeError("Barge tasks run only in a worker started by `barge worker`")
    return runtime
