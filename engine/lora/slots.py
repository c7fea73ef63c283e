"""SlotTable: which adapter sits in which of the device's max_loras weight slots.

    slots:   [ 0: adapter a | 1: adapter c | 2: free | 3: adapter b ]     max_loras = 4
    LRU:     b, a, c   (least recently used first: b is evicted first)

A step names the adapters its tokens use (never more than max_loras: the scheduler's gate,
engine/lora/gate.py); each already resident keeps its slot, each missing one takes a free
slot or the least recently used slot of an adapter this step does not use. Only tensors
move when a slot changes hands (engine/lora/manager.py); here it is bookkeeping, tested as
a table (tests/unit/test_lora_ops.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class SlotTable:
    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self._slot_of: OrderedDict[str, int] = OrderedDict()    # adapter_id -> slot, least recently used first

    @property
    def resident(self) -> dict[str, int]:
        return dict(self._slot_of)

    def assign(self, adapter_ids: Iterable[str]) -> tuple[dict[str, int], list[tuple[int, str]]]:
        """(adapter_id -> slot for the step's adapters, the (slot, adapter_id) loads that needs).
        ValueError when the step names more adapters than there are slots."""
        wanted = list(dict.fromkeys(adapter_ids))
        if len(wanted) > self.num_slots:
            raise ValueError(f"a step uses {len(wanted)} adapters; max_loras is {self.num_slots}")
        for adapter_id in wanted:
            if adapter_id in self._slot_of:
                self._slot_of.move_to_end(adapter_id)
        free = sorted(set(range(self.num_slots)) - set(self._slot_of.values()))
        loads = []
        for adapter_id in wanted:
            if adapter_id in self._slot_of:
                continue
            slot = free.pop(0) if free else self._evict()
            self._slot_of[adapter_id] = slot
            loads.append((slot, adapter_id))
        return {adapter_id: self._slot_of[adapter_id] for adapter_id in wanted}, loads

    def _evict(self) -> int:
        """The least recently used slot: never one this step wants, as those were moved to the end
        and there are no more of them than slots."""
        _, slot = self._slot_of.popitem(last=False)
        return slot
