"""`barge worker`: one process that loads its models once and serves their queues.

The pool is `solo`: the task runs in the process that holds the engine, so nothing is
forked after the model (or CUDA) is initialised, and the engine stays loaded between
shards. The worker also serves the control queue (planning, finalizing) and runs the
webhook dispatcher thread, and the engine watchdog (queueing.stall): an engine that makes
no progress ends the process, so that its shards are not held for ever.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import replace

from celery.signals import worker_shutting_down

from jobs.model_cards import announce
from jobs.models import model_mode, resolve_model
from jobs.private_files import tighten_data_dir
from jobs.settings import Settings
from jobs.store import Store
from jobs.unserved import unserved_jobs
from jobs.worker_beats import num_stalled
from queueing.app import create_app
from queueing.device_telemetry import DeviceTelemetry
from queueing.devices import DeviceSlot
from queueing.dispatch import Dispatcher
from jobs.fs_transport import bad_message_count
from jobs.messaging import CONTROL_QUEUE, model_queue, queue_name
from queueing.heartbeat import Heartbeat
from queueing.housekeeping import Housekeeper
from jobs.logs import configure_logging
from queueing.metrics import WorkerMetrics
from queueing.runtime import EngineKey, Runtime, WorkerOptions, attach_runtime
from queueing.stall import stall_exit, watch_from_env
from storage.fs import redact

log = logging.getLogger("barge.worker")


def serve(models: list[str], *, settings: Settings | None = None, loglevel: str = "INFO",
          preload: bool = True, metrics_port: int | None = None, device: DeviceSlot | None = None) -> int:
    """Serve until stopped; returns the process's exit status: 0 only after a drain
    (SIGTERM or SIGINT), else non-zero, with the reason on the last log line. No message
    content ends it: an unreadable message is set aside (queueing.fs_transport) or, on
    RabbitMQ and Redis, logged and dropped by Celery, and its work re-sent by a
    housekeeper. `metrics_port` overrides BARGE_METRICS_PORT; 0 turns the metrics server off.
    `device`: the slot this process serves (queueing.devices); None: the engine's default."""
    configure_logging(loglevel)
    settings = settings or Settings.from_env()
    tighten_data_dir(settings.data_dir)
    store = Store(settings.database_url)
    store.migrate()
    app = create_app(settings)
    options = WorkerOptions.from_env()
    if metrics_port is not None:
        options = replace(options, metrics_port=metrics_port)
    runtime = Runtime(settings=settings, store=store, app=app, options=options,
                      metrics=WorkerMetrics(store.shard_counts_by_model, lambda: num_stalled(store.engine),
                                            lambda: len(unserved_jobs(store.engine))),
                      device=device, watch=watch_from_env())
    heartbeat = Heartbeat(runtime)
    runtime.watch.on_stall = lambda reason: _stalled(heartbeat, reason)
    runtime.watch.start()   # before the models load: a load that hangs is a stall too (its longer limit)
    for name in models:
        ref = resolve_model(name)
        runtime.models[ref.key] = ref
        if preload:   # load now, not on the first shard: a broken model fails the worker at start
            runtime.engine_for(EngineKey(ref.key, model_mode(ref.path)))
    # A registered name may be known on the workers alone: a submit elsewhere checks it by its card.
    announce(store.engine, list(models), runtime.worker_id)
    if options.pipeline_depth > 0:
        from queueing.pipeline import ShardPipeline
        runtime.pipeline = ShardPipeline(runtime, depth=options.pipeline_depth)
    attach_runtime(app, runtime)
    queues = [queue_name(settings.namespace, queue)
              for queue in [CONTROL_QUEUE] + [model_queue(key) for key in runtime.models]]
    log.info("serving %s on %s", ", ".join(queues), redact(settings.broker_url))

    # SIGTERM (spot reclaim, scale-in): Celery stops consuming and waits for the running
    # task; the shard loop sees the drain deadline and releases its shard if it passes.
    worker_shutting_down.connect(lambda **_: runtime.begin_drain(), weak=False)
    threads = [Dispatcher(runtime, interval_s=float(os.environ.get("BARGE_DISPATCH_INTERVAL_S", "2"))),
               Housekeeper(runtime), heartbeat]
    for thread in threads:
        thread.start()
    if settings.is_embedded_broker:
        runtime.metrics.watch_bad_messages(lambda: bad_message_count(settings.broker_dir / "queue"))
    runtime.metrics.watch_device(DeviceTelemetry(device or DeviceSlot("cpu", 0)))
    if options.metrics_port:
        runtime.metrics.serve(options.metrics_port, options.metrics_addr)
    was_draining = False
    try:
        # app.start, not app.worker_main, which drops Celery's exit status.
        status = app.start(["worker", "--pool=solo", "--queues", ",".join(queues),
                            "--hostname", f"barge-{_slot_suffix(device)}{os.getpid()}@{socket.gethostname()}",
                            "--without-mingle", "--without-gossip", "--loglevel", loglevel]) or 0
        was_draining = runtime.drain_deadline is not None
    finally:
        if runtime.pipeline is not None:   # Celery has stopped consuming: let the engine finish (or release)
            runtime.begin_drain()
            runtime.pipeline.close(timeout_s=options.drain_grace_s + 30)
        runtime.watch.stop()
        for thread in threads:
            thread.stop()
        runtime.metrics.close()
    return _exit_status(status, was_draining)


def _stalled(heartbeat: Heartbeat, reason: str) -> None:
    """The engine stalled: the last beat says why (for the dashboard's workers page and the
    barge_engine_stalls metric), then the process exits. The beat gets 5 s: the database
    may be what the engine is stuck on."""
    beat = threading.Thread(target=heartbeat.beat, kwargs={"stopped_at": time.time(), "stall": reason}, daemon=True)
    beat.start()
    beat.join(timeout=5.0)
    stall_exit(reason)


def _slot_suffix(device: DeviceSlot | None) -> str:
    """"cuda3-" or "cpu1-" in the Celery hostname: one engine process per device slot."""
    return "" if device is None else f"{device.kind}{device.index}-"


def _exit_status(celery_status: int, was_draining: bool) -> int:
    """0 only for a drain that Celery ended cleanly; the reason goes on the last log line."""
    if was_draining and celery_status == 0:
        log.info("worker stopped: drained after SIGTERM or SIGINT; exit status 0")
        return 0
    status = celery_status or 1
    reason = "after a drain" if was_draining else "without being asked to (see the error above)"
    log.error("worker stopped: Celery ended with status %s %s; exit status %d", celery_status, reason, status)
    return status

