"""The broker as producers and workers both see it: the tasks' names, the queues, and the
Celery app that carries them. The client sends through it (plan, resume, write a partial
output); queueing/ builds its worker's app on `celery_app` (queueing.app) and registers
its tasks under these names (queueing.tasks). So both sides agree on names, queues and
broker settings while jobs/ imports nothing of queueing/.

Messages carry ids only (a job id, a shard index); everything else is read from SQL.

Planning, finalizing and other control work go to one queue any worker serves; shards go
to the queue of their model, served only by workers holding it. Code names queues
logically ("control", "model.<key>"); `queue_name` puts them in the deployment's
namespace (`BARGE_NAMESPACE`, default "barge"), so several deployments — or several test
runs — can share one broker without taking each other's messages.
"""

from __future__ import annotations

from celery import Celery
from kombu.transport import TRANSPORT_ALIASES

from jobs.hub_models import queue_key
from jobs.private_files import make_private_dir
from jobs.settings import Settings

PLAN_JOB = "barge.plan_job"                          # [job_id]: plan a QUEUED job into shards
RUN_SHARD = "barge.run_shard"                        # [job_id, shard_index], on the model's queue
RESUME_JOB = "barge.resume_job"                      # [job_id]: a retried job's window of shards, again
FINALIZE_JOB = "barge.finalize_job"                  # [job_id]: manifest, _SUCCESS, final state
WRITE_PARTIAL_OUTPUT = "barge.write_partial_output"  # [job_id]: an unfinished job's partial manifest

CONTROL_QUEUE = "control"

# The embedded default's broker is kombu's filesystem transport made safe to share
# between processes (jobs.fs_transport); `filesystem://` in the settings means it.
EMBEDDED_TRANSPORT = "barge-fs"
TRANSPORT_ALIASES.setdefault(EMBEDDED_TRANSPORT, "jobs.fs_transport:Transport")


def model_queue(model_key: str) -> str:
    return f"model.{queue_key(model_key)}"   # a Hub model: one queue for all its commits


def queue_name(namespace: str, queue: str) -> str:
    return f"{namespace}.{queue}"


def celery_app(settings: Settings) -> Celery:
    """The app every process talks to the broker with: the broker, its transport options,
    the default queue, the serializer and the priorities, which producers and workers must
    declare alike (RabbitMQ refuses a queue declared again with other arguments)."""
    app = Celery("barge", broker=_broker_url(settings), set_as_current=False)
    app.conf.update(
        broker_transport_options=_transport_options(settings),
        broker_connection_retry_on_startup=True,
        task_default_queue=queue_name(settings.namespace, CONTROL_QUEUE),
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        # Priorities (JobSpec.priority 0..9): RabbitMQ queues get x-max-priority; on
        # Redis, kombu keeps one list per priority step and serves them in order.
        task_queue_max_priority=10,
        task_default_priority=5,
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
