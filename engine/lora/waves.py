"""plan_adapter_waves: an order for rows of many adapters, in waves of at most max_loras adapters.

    input:   A B C D A E B F C G ...       8 adapters, max_loras 4
    waves:   [A A B B C C D D] [E E F F G G H H]      (rows of one wave in input order)

Fed in input order, a window of rows (the generate feed keeps 2 x max_num_seqs queued)
soon names more adapters than there are slots: the scheduler's gate holds back the rows
of adapters that are not running, so the batch can run thin where the running adapters'
rows in the window are few, and slots change hands as adapters come and go. In waves,
the window names at most max_loras adapters until the wave's last rows and each adapter
is loaded into a slot once (bench/lora_bench.py: 8 slot loads against 24; its throughput
gain is not yet shown, docs/design.md). Base rows (None) need no slot; they run with the first wave. Pure: the feed (or a
shard planner) permutes its rows with it and puts outputs back at their own index.
"""

from __future__ import annotations

from collections.abc import Sequence


def plan_adapter_waves(adapter_keys: Sequence[str | None], max_loras: int) -> list[int]:
    """Row indices in wave order: adapters in order of first appearance, max_loras to a wave."""
    if max_loras < 1:
        raise ValueError(f"max_loras must be >= 1, got {max_loras}")
    first_seen = list(dict.fromkeys(key for key in adapter_keys if key is not None))
    wave_of = {key: index // max_loras for index, key in enumerate(first_seen)}
    return sorted(range(len(adapter_keys)),
                  key=lambda row: 0 if adapter_keys[row] is None else wave_of[adapter_keys[row]])
