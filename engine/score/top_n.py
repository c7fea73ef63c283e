"""top_n: the best N rows of each group by score — a pure decision, table-tested in
tests/unit/engine/score/test_top_n.py. Torch-free."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence


def top_n(scores: Sequence[float | None], groups: Sequence[Hashable], n: int) -> dict[Hashable, list[int]]:
    """group -> the row indices of its best `n` scores, best first.

    Groups come in the order they first appear; equal scores keep their input order. A row
    without a score (None, an error row, or NaN) is never ranked, so a group of such rows
    only maps to []. ValueError when `n` is not a positive int or the two columns differ
    in length."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    if len(scores) != len(groups):
        raise ValueError(f"scores has {len(scores)} rows, groups {len(groups)}")
    rows_by_group: dict[Hashable, list[int]] = {}
    for row, group in enumerate(groups):
        rows_by_group.setdefault(group, []).append(row)
    return {group: sorted((row for row in rows if _is_scored(scores[row])), key=lambda row: -scores[row])[:n]
            for group, rows in rows_by_group.items()}


def _is_scored(score: float | None) -> bool:
    return score is not None and not math.isnan(score)
