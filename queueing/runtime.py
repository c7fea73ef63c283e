"""What one worker process holds between tasks: settings, the store, loaded engines."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from celery import Celery

from jobs.models import ModelRef
from jobs.settings import Settings
from jobs.store import Store
from queueing.routing import queue_name

log = logging.getLogger("barge.worker")


@dataclass
class Runtime:
    settings: Settings
    store: Store
    app: Celery
    models: dict[str, ModelRef] = field(default_factory=dict)      # model key -> ref
    engines: dict[tuple[str, str], object] = field(default_factory=dict)   # (model key, mode) -> Engine
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def engine_for(self, model_key: str, mode: str):
        """The engine for a model this worker serves, loaded once and kept."""
        with self._lock:
            engine = self.engines.get((model_key, mode))
            if engine is None:
                ref = self.models.get(model_key)
                if ref is None:
                    raise LookupError(f"this worker does not serve model {model_key!r}")
                from engine import Engine   # heavy: torch loads only in model-serving processes
                log.info("loading model %s (%s) for %s", ref.key, ref.path, mode)
                engine = Engine.from_pretrained(ref.path, mode=mode)
                self.engines[(model_key, mode)] = engine
            return engine

    def send(self, task_name: str, args: list, queue: str) -> None:
        """Send a task to a logical queue (queueing.routing) of this deployment."""
        self.app.send_task(task_name, args=args, queue=queue_name(self.settings.namespace, queue))


def attach_runtime(app: Celery, runtime: Runtime) -> None:
    app.barge_runtime = runtime


def runtime_of(app: Celery) -> Runtime:
    runtime = getattr(app, "barge_runtime", None)
    if runtime is None:
        raise RuntimeError("Barge tasks run only in a worker started by `barge worker`")
    return runtime
