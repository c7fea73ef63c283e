"""plan_prefix_order: the order a batch of prompts runs in, so that each shared prefix is
computed once and the rows that share it follow it onto its cached blocks — a pure
decision over token ids, table-tested in tests/unit/test_prefix_order.py. Torch-free.

Offline prompts are built from templates (an instruction or few-shot block, then the
row's text). In input order a template's rows are spread over the whole run, so with a
KV cache smaller than all the templates a template is evicted and computed again between
its rows; rows of one template arriving together were admitted together and each computed
it (the scheduler's hold-back, scheduler.py, now stops that). Sorted by token ids, rows
with a common prefix lie next to each other, and the sorted list is a walk of the trie of
the prompts: the common prefix of neighbours (their LCP) says how deep their paths run
together, and every trie node is entered once.

    sorted prompts            LCP with the one before     trie
    A A A x                   -                           A A A -+- x
    A A A y                   3                                  +- y
    A A B z                   2                               B z
    C w                       0                           C w

    distinct trie nodes = sum of lengths - sum of LCPs = 4 + 4 + 4 + 2 - (3 + 2 + 0) = 9

That count is the lower bound on prefill tokens for the batch with an empty cache (each
distinct prefix token computed once, every suffix once); the engine comes within a block
per row of it, since the cache shares whole blocks and never serves a prompt's last token.

Deepest first: at every trie node, the child groups whose rows share the longest prefix
run first, and rows that share only the node's own prefix run last. A deep group's rows
gain the most from the cache and follow their leader while its blocks are surely there;
the shallower rows still find the node's prefix, which is the head of those same blocks.
Rows with equal prompts keep their input order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PrefixPlan:
    order: list[int]                # row indices in the order to run them; every row exactly once
    num_prompt_tokens: int          # tokens of all the prompts
    num_distinct_tokens: int        # distinct nodes of the prompts' token trie: the prefill lower bound


def plan_prefix_order(prompts: Sequence[Sequence[int]]) -> PrefixPlan:
    """Rows grouped by shared token prefix, deepest shared prefixes first."""
    by_tokens = sorted(range(len(prompts)), key=prompts.__getitem__)
    arrays = [np.asarray(prompts[row], dtype=np.int64) for row in by_tokens]
    # lcps[k]: tokens prompt by_tokens[k] shares with by_tokens[k - 1]; lcps[0] is 0 (nothing before it).
    lcps = [_common_prefix_len(arrays[k - 1], arrays[k]) if k else 0 for k in range(len(arrays))]
    num_prompt_tokens = sum(len(array) for array in arrays)
    return PrefixPlan(order=[by_tokens[k] for k in _deepest_first(lcps)], num_prompt_tokens=num_prompt_tokens,
                      num_distinct_tokens=num_prompt_tokens - sum(lcps))


def _common_prefix_len(first: np.ndarray, second: np.ndarray) -> int:
    length = min(len(first), len(second))
    differ = np.flatnonzero(first[:length] != second[:length])
    return int(differ[0]) if len(differ) else length


def _deepest_first(lcps: list[int]) -> list[int]:
    """Positions of the sorted list, each trie node's child groups deepest first.

    A range of sorted positions is one trie node's subtree: its rows share min(lcps) over
    the range's inner boundaries, and its children are the runs between the boundaries at
    that minimum. An explicit stack: a chain of nested prefixes can be as deep as the rows.
    """
    order: list[int] = []
    stack = [(0, len(lcps))] if lcps else []
    while stack:
        low, high = stack.pop()
        if high - low == 1:
            order.append(low)
            continue
        depth = min(lcps[low + 1:high])
        cuts = [low] + [k for k in range(low + 1, high) if lcps[k] == depth] + [high]
        children = list(zip(cuts, cuts[1:]))
        children.sort(key=lambda child: -_shared_depth(lcps, *child, depth))    # stable: ties stay sorted
        stack.extend(reversed(children))
    return order


def _shared_depth(lcps: list[int], low: int, high: int, parent_depth: int) -> int:
    """Tokens the rows of positions low..high-1 share; a lone row shares only its parent's."""
    return min(lcps[low + 1:high]) if high - low > 1 else parent_depth
