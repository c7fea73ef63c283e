"""The Celery application, configured from `jobs.settings.Settings`.

Tasks are acknowledged late and rejected back to the queue when a worker process is
lost, so a crash means re-delivery, never loss; Barge's own SQL state (attempt tokens,
committed shards) turns that at-least-once delivery into exactly-once output.
"""

from __future__ import annotations

from celery import Celery
from kombu.transport import TRANSPORT_ALIASES

from jobs.private_files import make_private_dir
from jobs.settings import Settings
from queueing.routing import CONTROL_QUEUE, queue_name

# The embedded default's broker is kombu's filesystem transport made safe to share
# between processes (queueing.fs_transport); `filesystem://` in the settings means it.
EMBEDDED_TRANSPORT = "barge-fs"
TRANSPORT_ALIASES.setdefault(EMBEDDED_TRANSPORT, "queueing.fs_transport:Transport")


def create_app(settings: Settings) -> Celery:
    app = Celery("barge", broker=_broker_url(settings), set_as_current=False)
    app.conf.update(
        broker_transport_options=_transport_options(settings),
        broker_connection_retry_on_startup=True,
        task_default_queue=queue_name(settings.namespace, CONTROL_QUEUE),
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        worker_prefetch_multiplier=1,
        # Priorities (JobSpec.priority 0..9): RabbitMQ queues get x-max-priority; on
        # Redis, kombu keeps one list per priority step and serves them in order.
        task_queue_max_priority=10,
        task_default_priority=5,
        worker_hijack_root_logger=False,
        # The filesystem transport has no fanout exchange for remote control.
        worker_enable_remote_control=not settings.is_embedded_broker,
        worker_send_task_events=False,
        imports=("queueing.tasks",),
    )
    return app


def _broker_url(settings: Settings) -> str:
    if settings.is_embedded_broker:
        make_private_dir(settings.data_dir, tighten=False)   # the broker's folder sits in the data folder
        for folder in ("queue", "control"):
            (settings.broker_dir / folder).mkdir(parents=True, exist_ok=True)
        return f"{EMBEDDED_TRANSPORT}://"
    return settings.broker_url


def _transport_options(settings: Settings) -> dict:
    if settings.is_embedded_broker:
        folder = str(settings.broker_dir / "queue")
        # control_folder holds the exchange bindings that producers and workers share;
        # kombu's default is a folder relative to the current directory.
        return {"data_folder_in": folder, "data_folder_out": folder, "store_processed": False,
                "control_folder": str(settings.broker_dir / "control"), "polling_interval": 0.2}
    if settings.broker_url.startswith(("redis://", "rediss://")):
        # visibility_timeout only matters for planning and finalizing (acknowledged late,
        # and short); shards are acknowledged at start and kept safe by their leases.
        return {"visibility_timeout": settings.visibility_timeout_s, "priority_steps": list(range(10)), "sep": ":",
                "queue_order_strategy": "priority"}
    return {}
