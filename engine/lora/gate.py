"""The scheduler's LoRA admission rule: the running batch never holds more than max_loras
distinct adapters, so every step's adapters fit the device's slots (engine/lora/slots.py).

A request of the base model, or of an adapter already running, is always admissible;
a new adapter waits until one running adapter's last request leaves the batch. The
scheduler then admits the next waiting request that passes (vLLM's rule); which adapter
comes when over a dataset is the caller's order (waves of max_loras adapters).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class _HasAdapterKey(Protocol):
    adapter_key: str | None


def admits(request: _HasAdapterKey, running: Iterable[_HasAdapterKey], max_loras: int | None) -> bool:
    """May `request` join `running` without the batch exceeding max_loras adapters (None: no LoRA)?"""
    if max_loras is None or request.adapter_key is None:
        return True
    running_keys = {other.adapter_key for other in running if other.adapter_key is not None}
    return request.adapter_key in running_keys or len(running_keys) < max_loras
