"""plan_wave_order: the order a LoRA job's rows run in — waves of at most max_loras adapters,
each adapter's rows together and in prefix order. A pure decision over adapter names and
token ids, table-tested in tests/unit/test_lora_feed_order.py. Torch-free.

    rows (adapter each):   A B C D A E B F C G D H - -        8 adapters, the base (-), max_loras 4
    waves:                 [- - A A B B C C D D] [E F G H]
    wave 0 queued:         the feed reads E F G H from storage (LoraManager.prefetch) while it runs

Fed in input order, a window of rows (the generate feed keeps 2 x max_num_seqs queued) soon
names more adapters than there are slots: the scheduler's gate (gate.py) holds back the rows
of adapters that are not running, so the batch runs thin where the running adapters' rows in
the window are few, slots change hands as adapters come and go, and each adapter is read from
storage on the caller's thread when its first row is queued. In waves, the window names at
most max_loras adapters until a wave's last rows, each adapter takes a slot once, and the
next wave's adapters are on the host before their rows come.

Within a wave: the base model's rows (first wave only: they need no slot), then each
adapter's rows, adapters in order of first appearance. Each adapter's rows are in prefix
order (engine/generate/prefix_order.py) among themselves only: the prefix cache is keyed by
adapter (block_manager), so two adapters' rows never share a block, and the prefill lower
bound is the sum of each adapter's own.

`running`: the adapters the engine runs now (the previous shard's last wave) come first, so
a shard boundary keeps them in their slots instead of loading a whole wave before coming
back to them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.generate.prefix_order import plan_prefix_order


@dataclass(frozen=True)
class Wave:
    adapters: tuple[str, ...]       # whose rows run in it, in that order (the first wave: after the base's rows)
    start: int                      # position in WavePlan.order of its first row


@dataclass(frozen=True)
class WavePlan:
    order: list[int]                # row indices in the order to run them; every row exactly once
    waves: list[Wave]               # in order; a wave's rows are order[start:next wave's start]
    num_distinct_tokens: int        # summed over adapters (and the base): the prefill lower bound


def adapter_waves(adapter_keys: Sequence[str | None], max_loras: int,
                  running: Sequence[str] = ()) -> list[tuple[str, ...]]:
    """The adapters of each wave, max_loras to a wave: those of `running` that rows name, then
    the others in order of first appearance. None (the base) is in no wave."""
    if max_loras < 1:
        raise ValueError(f"max_loras must be >= 1, got {max_loras}")
    named = dict.fromkeys(key for key in adapter_keys if key is not None)
    first = [key for key in dict.fromkeys(running) if key in named]
    ordered = first + [key for key in named if key not in first]
    return [tuple(ordered[start:start + max_loras]) for start in range(0, len(ordered), max_loras)]


def plan_wave_order(prompts: Sequence[Sequence[int]], adapter_keys: Sequence[str | None], max_loras: int,
                    running: Sequence[str] = ()) -> WavePlan:
    """Rows in waves of at most max_loras adapters, grouped by adapter, each adapter's rows
    in prefix order. adapter_keys: each row's adapter (None: the base model)."""
    if len(prompts) != len(adapter_keys):
        raise ValueError(f"{len(prompts)} prompts but {len(adapter_keys)} adapter keys")
    if not prompts:
        return WavePlan([], [], 0)
    rows_of: dict[str | None, list[int]] = {}       # adapter -> its rows, in input order
    for row, key in enumerate(adapter_keys):
        rows_of.setdefault(key, []).append(row)
    order: list[int] = []
    waves: list[Wave] = []
    num_distinct_tokens = 0
    for index, adapters in enumerate(adapter_waves(adapter_keys, max_loras, running) or [()]):
        waves.append(Wave(adapters, len(order)))
        for key in ((None,) if index == 0 and None in rows_of else ()) + adapters:
            rows = rows_of[key]
            plan = plan_prefix_order([prompts[row] for row in rows])
            order += [rows[k] for k in plan.order]
            num_distinct_tokens += plan.num_distinct_tokens
    return WavePlan(order, waves, num_distinct_tokens)
