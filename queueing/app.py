"""The worker's Celery application: jobs.messaging's app (the broker, its queues and the
settings every producer shares), with the tasks of queueing.tasks and how a worker consumes.

Tasks are acknowledged late and rejected back to the queue when a worker process is
lost, so a crash means re-delivery, never loss; Barge's own SQL state (attempt tokens,
committed shards) turns that at-least-once delivery into exactly-once output.
"""

from __future__ import annotations

from celery import Celery

from jobs.messaging import celery_app
from jobs.settings import Settings


def create_app(settings: Settings) -> Celery:
    app = celery_app(settings)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        # The filesystem transport has no fanout exchange for remote control.
        worker_enable_remote_control=not settings.is_embedded_broker,
        worker_send_task_events=False,
        imports=("queueing.tasks",),
    )
    return app
