"""plan_rounds: the order a yes/no rerank runs its pairs in, so that the generate engine's
prefix cache computes each query's prompt once — a pure decision, table-tested in
tests/unit/engine/score/test_query_groups.py. Torch-free.

NOTE: the prefix cache only shares blocks whose K/V are already computed. Pairs of one
query admitted in the same step would each compute the shared prompt again, so a query's
first pair (its leader) runs a round ahead of the rest (its followers), which then find
the instruction + query blocks cached. Leaders and followers of different queries share
nothing, so one round runs the followers of one wave of queries beside the leaders of
the next, and the engine's batches stay full:

    round 0   leaders of wave 0
    round 1   followers of wave 0  |  leaders of wave 1
    round 2   followers of wave 1  |  leaders of wave 2
    ...
    last      followers of the last wave

A wave is as many queries as fit `max_wave_tokens` prompt tokens (at most
`max_wave_groups`; a query alone always fits): the KV cache (about twice that) must keep a
wave's cached prefixes while the next round's blocks come and go, or the least recently
used of them would be evicted before their followers read them.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence


def plan_rounds(keys: Sequence[Hashable], lengths: Sequence[int], max_wave_tokens: int,
                max_wave_groups: int) -> list[list[int]]:
    """Row indices round by round (every row exactly once): keys[row] names the row's
    query (rows with equal keys share a prompt prefix), lengths[row] its prompt tokens.
    Queries in the order they first appear, each round's followers before its leaders,
    rows of a query in input order."""
    for name, value in (("max_wave_tokens", max_wave_tokens), ("max_wave_groups", max_wave_groups)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if len(keys) != len(lengths):
        raise ValueError(f"keys has {len(keys)} rows, lengths {len(lengths)}")
    rows_by_key: dict[Hashable, list[int]] = {}
    for row, key in enumerate(keys):
        rows_by_key.setdefault(key, []).append(row)
    rounds: list[list[int]] = []
    followers: list[int] = []
    for wave in _waves(list(rows_by_key.values()), lengths, max_wave_tokens, max_wave_groups):
        rounds.append(followers + [rows[0] for rows in wave])
        followers = [row for rows in wave for row in rows[1:]]
    if followers:
        rounds.append(followers)
    return rounds


def _waves(groups: list[list[int]], lengths: Sequence[int], max_tokens: int, max_groups: int) -> list[list[list[int]]]:
    waves: list[list[list[int]]] = []
    wave_tokens = 0
    for rows in groups:
        tokens = sum(lengths[row] for row in rows)
        if waves and len(waves[-1]) < max_groups and wave_tokens + tokens <= max_tokens:
            waves[-1].append(rows)
            wave_tokens += tokens
        else:
            waves.append([rows])
            wave_tokens = tokens
    return waves
