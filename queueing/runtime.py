"""What one worker process holds between tasks: settings, the store, loaded engines,
its knobs, and whether it is draining."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from celery import Celery

from engine.lora.options import LoraOptions   # torch-free

from jobs.hub_models import is_hub_key, queue_key
from jobs.models import ModelRef, resolve_model
from jobs.records import JobRecord
from jobs.settings import Settings
from jobs.store import Store
from queueing.devices import DeviceSlot
from queueing.metrics import WorkerMetrics
from jobs.messaging import model_queue, queue_name
from queueing.stall import EngineWatch
from queueing.usage import engine_settings

if TYPE_CHECKING:
    from engine.engine import Engine
    from queueing.delivery_pool import DeliveryPool

log = logging.getLogger("barge.worker")


@dataclass(frozen=True)
class EngineKey:
    """Which loaded engine runs a job's rows: a worker keeps one Engine per key, loaded once.
    An FP8 engine and the model's 16-bit one are separate engines, and so is an engine of a
    dtype or a KV cache dtype a job names, and one with LoRA slots: a job that names no
    adapter keeps the base engine as it was."""

    model_key: str                      # the served model (jobs.models.ModelRef.key; a Hub id pinned to a commit)
    mode: str                           # "embed" | "generate" | "transcribe" | "classify" | "score"
    quantization: str | None = None     # None: the checkpoint's; "fp8", "fp8-block", "fp8-group": FP8 linears
    dtype: str | None = None            # embed: a dtype the job names (JobSpec.dtype); None: the engine's default
    kv_cache_dtype: str | None = None   # generate: "fp8" (JobSpec.kv_cache_dtype); None: the model's dtype
    lora: bool = False                  # generate: LoRA slots (the job names an adapter, or an adapter column)

    @classmethod
    def for_job(cls, job: JobRecord) -> "EngineKey":
        spec = job.spec
        lora = spec.adapter is not None or spec.params.get("adapter_column") is not None
        return cls(job.model_key, spec.mode, spec.quantization, spec.dtype, spec.kv_cache_dtype, lora)

    @property
    def baseline(self) -> "EngineKey":
        """The same model and mode at the engine's defaults: what an FP8 engine is checked against."""
        return EngineKey(self.model_key, self.mode)


class Pipeline(Protocol):
    """queueing.pipeline.ShardPipeline as the worker sees it (a Protocol: that module imports this one)."""

    def submit(self, work) -> None: ...

    def wait_idle(self) -> None: ...

    def close(self, timeout_s: float | None = None) -> None: ...


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
    max_loras: int = LoraOptions.max_loras   # a LoRA engine's adapters resident at once (the most one step mixes);
                                             # the largest rank is the deployment's (Settings.max_lora_rank)
    prefix_order: bool = True       # generate: rows in shared-prefix order and the scheduler's hold-back
                                    # (GenerateOptions.order_by_prefix, prefix_aware_admission); False: first
                                    # come, first served, as before issue 47 (for comparing; BARGE_PREFIX_ORDER=0)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "WorkerOptions":
        env = os.environ if env is None else env
        names = {"lease_s": "BARGE_LEASE_S", "max_attempts": "BARGE_MAX_ATTEMPTS", "job_window": "BARGE_JOB_WINDOW",
                 "drain_grace_s": "BARGE_DRAIN_GRACE_S", "housekeeping_s": "BARGE_HOUSEKEEPING_S",
                 "requeue_after_s": "BARGE_REQUEUE_AFTER_S", "chunk_rows": "BARGE_CHUNK_ROWS",
                 "metrics_port": "BARGE_METRICS_PORT", "metrics_addr": "BARGE_METRICS_ADDR",
                 "kv_cache_fraction": "BARGE_KV_CACHE_FRACTION", "pipeline_depth": "BARGE_PIPELINE_DEPTH",
                 "transient_retry_s": "BARGE_TRANSIENT_RETRY_S", "gpu_memory_fraction": "BARGE_GPU_MEMORY_FRACTION",
                 "tidy_s": "BARGE_TIDY_S", "staging_retention_s": "BARGE_STAGING_RETENTION_S",
                 "max_loras": "BARGE_MAX_LORAS", "prefix_order": "BARGE_PREFIX_ORDER"}
        values = {}
        for name, variable in names.items():
            if env.get(variable):
                kind = float if name in ("kv_cache_fraction", "gpu_memory_fraction") else type(getattr(cls, name))
                if kind is bool:
                    if env[variable] not in ("0", "1"):
                        raise ValueError(f"{variable}: {env[variable]!r} is not 0 or 1")
                    values[name] = env[variable] == "1"
                    continue
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
    engines: dict[EngineKey, Engine] = field(default_factory=dict)   # each loaded once, on its first job
    metrics: WorkerMetrics = field(default_factory=WorkerMetrics)
    drain_deadline: float | None = None    # set on SIGTERM: monotonic time the current shard must end by
    pipeline: Pipeline | None = None       # queueing.pipeline.ShardPipeline when pipeline_depth > 0
    deliveries: DeliveryPool | None = None   # the worker's Dispatcher's pool
    device: DeviceSlot | None = None       # the slot this process serves (queueing.devices); None: engine default
    watch: EngineWatch = field(default_factory=EngineWatch)   # engine progress; its watchdog runs in `barge worker`
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def engine_for(self, key: EngineKey) -> Engine:
        """The engine for a model this worker serves, loaded once and kept under its key."""
        with self._lock:
            engine = self.engines.get(key)
            if engine is None:
                with self.watch.busy(f"loading {key.model_key} for {key.mode}", loading=True):
                    engine = self._load_engine(key)
                self.watch.watch(engine)
                self.metrics.observe_engine(engine, key.model_key, key.mode)
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

    def load_engine(self, key: EngineKey) -> Engine:
        """A fresh engine that this runtime does not keep (the unquantized baseline of a
        job's FP8 check): the caller drops it when done."""
        with self._lock, self.watch.busy(f"loading {key.model_key} for {key.mode} (a baseline)", loading=True):
            engine = self._load_engine(key)
        self.watch.watch(engine)
        return engine

    def _load_engine(self, key: EngineKey) -> Engine:
        ref = self.models.get(key.model_key)
        if ref is None:
            raise LookupError(f"this worker does not serve model {key.model_key!r}")
        from engine import Engine   # heavy: torch loads only in model-serving processes
        log.info("loading model %s (%s) for %s%s%s%s", ref.key, ref.path, key.mode,
                 f", {key.quantization} weights" if key.quantization else "",
                 f", {key.kv_cache_dtype} KV cache" if key.kv_cache_dtype else "",
                 f", LoRA slots ({self.options.max_loras}, rank {self.settings.max_lora_rank})" if key.lora else "")
        options = {}
        if key.mode == "generate" or (key.mode == "score" and _is_yes_no_reranker(ref.path)):
            options.update(self._memory_options())     # a yes/no reranker runs on the generate engine
            if not self.options.prefix_order:
                options.update(order_by_prefix=False, prefix_aware_admission=False)
        if self.device is not None:
            options["device"] = self.device.torch_device
        if key.dtype is not None:
            options["dtype"] = key.dtype
        if key.kv_cache_dtype is not None:
            options["kv_cache_dtype"] = key.kv_cache_dtype
        if key.lora:
            options["lora"] = self._lora_options()
        engine = Engine.from_pretrained(ref.path, mode=key.mode, quantization=key.quantization, **options)
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

    def _lora_options(self) -> LoraOptions:
        """BARGE_MAX_LORAS slots, BARGE_MAX_LORA_RANK (the rank a submit checks against)."""
        max_loras = self.options.max_loras
        return LoraOptions(max_loras, self.settings.max_lora_rank, max(LoraOptions.max_cpu_loras, max_loras))

    def engine_settings(self, key: EngineKey) -> dict:
        """The settings of the engine serving this key, as recorded with each commit: read
        afresh each time, since an engine lowers its batch budget after an out-of-memory
        error (engine.oom) and the shards it commits after that record the lower one."""
        return engine_settings(self.engine_for(key), key.model_key)

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


def _is_yes_no_reranker(path: str) -> bool:
    from engine.score.head_config import score_method   # torch-free: config.json alone
    return score_method(path) == "yes-no"


def attach_runtime(app: Celery, runtime: Runtime) -> None:
    app.barge_runtime = runtime


def runtime_of(app: Celery) -> Runtime:
    runtime = getattr(app, "barge_runtime", None)
    if runtime is None:
        raise RuntimeError("Barge tasks run only in a worker started by `barge worker`")
    return runtime
