"""plan_rounds: a rerank's pairs in rounds, each query's leader a round ahead of its followers."""

import pytest

from engine.score.query_groups import plan_rounds


@pytest.mark.parametrize("keys, lengths, max_wave_tokens, max_wave_groups, expected", [
    # Given two queries that fit one wave: their leaders, then all their followers.
    (["a", "a", "b", "b", "a"], [10] * 5, 1000, 8, [[0, 2], [1, 4, 3]]),
    # One query per wave: round r runs wave r-1's followers, then wave r's leader.
    (["a", "a", "b", "b", "c"], [10] * 5, 1000, 1, [[0], [1, 2], [3, 4]]),
    # The token budget splits the waves: a and b (20 + 20) fit 45, c starts the next.
    (["a", "b", "a", "c", "b", "c"], [10] * 6, 45, 8, [[0, 1], [2, 4, 3], [5]]),
    # A query bigger than the budget still gets a wave of its own.
    (["a", "a", "b"], [100, 100, 10], 50, 8, [[0], [1, 2]]),
    # Queries of one pair only: leaders, no followers.
    (["a", "b", "c"], [5, 5, 5], 1000, 8, [[0, 1, 2]]),
    ([], [], 10, 1, []),
])
def test_plan_rounds(keys, lengths, max_wave_tokens, max_wave_groups, expected):
    rounds = plan_rounds(keys, lengths, max_wave_tokens, max_wave_groups)
    assert rounds == expected
    assert sorted(row for rows in rounds for row in rows) == list(range(len(keys)))


def test_every_follower_runs_in_a_round_after_its_leader():
    keys = [index % 7 for index in range(60)]
    rounds = plan_rounds(keys, [index % 5 + 1 for index in range(60)], max_wave_tokens=20, max_wave_groups=3)
    round_of = {row: number for number, rows in enumerate(rounds) for row in rows}
    leaders = {key: keys.index(key) for key in set(keys)}
    assert all(round_of[row] == round_of[leaders[key]] + 1 for row, key in enumerate(keys) if row != leaders[key])


@pytest.mark.parametrize("arguments, message", [
    ((["a"], [1], 0, 1), "max_wave_tokens"),
    ((["a"], [1], 1, 0), "max_wave_groups"),
    ((["a"], [1, 2], 1, 1), "keys has 1 rows, lengths 2"),
])
def test_bad_arguments_are_refused(arguments, message):
    with pytest.raises(ValueError, match=message):
        plan_rounds(*arguments)
