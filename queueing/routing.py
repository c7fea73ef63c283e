"""Queue names. Planning, finalizing and other control work go to one queue any worker
serves; shards go to the queue of their model, served only by workers holding it.

Code names queues logically ("control", "model.<key>"); `queue_name` puts them in the
deployment's namespace (`BARGE_NAMESPACE`, default "barge"), so several deployments —
or several test runs — can share one broker without taking each other's messages.
"""

from __future__ import annotations

from jobs.hub_models import queue_key

CONTROL_QUEUE = "control"


def model_queue(model_key: str) -> str:
    return f"model.{queue_key(model_key)}"   # a Hub model: one queue for all its commits


def queue_name(namespace: str, queue: str) -> str:
    return f"{namespace}.{queue}"
