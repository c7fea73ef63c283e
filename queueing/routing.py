"""Queue names. Planning, finalizing and other control work go to one queue any worker
serves; shards go to the queue of their model, served only by workers holding it."""

from __future__ import annotations

CONTROL_QUEUE = "barge.control"


def model_queue(model_key: str) -> str:
    return f"barge.model.{model_key}"
