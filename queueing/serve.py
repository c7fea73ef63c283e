"""`barge worker`: one process that loads its models once and serves their queues.

The pool is `solo`: the task runs in the process that holds the engine, so nothing is
forked after the model (or CUDA) is initialised, and the engine stays loaded between
shards. The worker also serves the control queue (planning, finalizing) and runs the
webhook dispatcher thread.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import replace

from celery.signals import worker_shutting_down

from jobs.models import model_mode, resolve_model
from jobs.settings import Settings
from jobs.store import Store
from queueing.app import create_app
from queueing.dispatch import Dispatcher
from queueing.routing import CONTROL_QUEUE, model_queue, queue_name
from queueing.housekeeping import Housekeeper
from queueing.logs import configure_logging
from queueing.metrics import WorkerMetrics
from queueing.runtime import Runtime, WorkerOptions, attach_runtime
from storage.fs import redact

log = logging.getLogger("barge.worker")


def serve(models: list[str], *, settings: Settings | None = None, loglevel: str = "INFO",
          preload: bool = True, metrics_port: int | None = None) -> None:
    """`metrics_port` overrides BARGE_METRICS_PORT; 0 turns the metrics server off."""
    configure_logging(loglevel)
    settings = settings or Settings.from_env()
    store = Store(settings.database_url)
    store.migrate()
    app = create_app(settings)
    options = WorkerOptions.from_env()
    if metrics_port is not None:
        options = replace(options, metrics_port=metrics_port)
    runtime = Runtime(settings=settings, store=store, app=app, options=options,
                      metrics=WorkerMetrics(store.shard_counts_by_model))
    for name in models:
        ref = resolve_model(name)
        runtime.models[ref.key] = ref
        if preload:   # load now, not on the first shard: a broken model fails the worker at start
            runtime.engine_for(ref.key, model_mode(ref.path))
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
               Housekeeper(runtime)]
    for thread in threads:
        thread.start()
    if options.metrics_port:
        runtime.metrics.serve(options.metrics_port, options.metrics_addr)
    try:
        app.worker_main(["worker", "--pool=solo", "--queues", ",".join(queues),
                         "--hostname", f"barge-{os.getpid()}@{socket.gethostname()}",
                         "--without-mingle", "--without-gossip", "--loglevel", loglevel])
    finally:
        if runtime.pipeline is not None:   # Celery has stopped consuming: let the engine finish (or release)
            runtime.begin_drain()
            runtime.pipeline.close(timeout_s=options.drain_grace_s + 30)
        for thread in threads:
            thread.stop()
        runtime.metrics.close()
