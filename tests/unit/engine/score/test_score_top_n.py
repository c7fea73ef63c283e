"""top_n: the best N rows of each group, ties by input order, unscored rows never ranked."""

import math

import pytest

from engine.score.top_n import top_n

NAN = math.nan


@pytest.mark.parametrize("scores, groups, n, expected", [
    # Given one group, when N is smaller than it, then the N best come, best first.
    ([0.1, 0.9, 0.5], ["q", "q", "q"], 2, {"q": [1, 2]}),
    # N larger than a group: all of it.
    ([0.1, 0.9, 0.5], ["q", "q", "q"], 5, {"q": [1, 2, 0]}),
    # Groups in order of first appearance, interleaved rows.
    ([0.3, 0.8, 0.6, 0.1], ["b", "a", "b", "a"], 1, {"b": [2], "a": [1]}),
    # Ties keep input order.
    ([0.5, 0.7, 0.5, 0.7], ["q"] * 4, 3, {"q": [1, 3, 0]}),
    # Rows without a score (None, NaN) are never ranked; a group of them maps to [].
    ([None, 0.2, NAN, 0.1], ["q", "q", "r", "q"], 2, {"q": [1, 3], "r": []}),
    # Negative scores and -inf still rank.
    ([-1.0, -math.inf, -0.5], ["q"] * 3, 3, {"q": [2, 0, 1]}),
    # Any hashable group: ints, tuples.
    ([1.0, 2.0, 3.0], [(1, "x"), 7, (1, "x")], 1, {(1, "x"): [2], 7: [1]}),
    ([], [], 3, {}),
])
def test_top_n(scores, groups, n, expected):
    result = top_n(scores, groups, n)
    assert result == expected
    assert list(result) == list(expected)       # groups in order of first appearance


@pytest.mark.parametrize("n", [0, -1, 1.5, True, None])
def test_n_must_be_a_positive_int(n):
    with pytest.raises(ValueError, match="n must be a positive int"):
        top_n([1.0], ["q"], n)


def test_columns_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="scores has 2 rows, groups 1"):
        top_n([1.0, 2.0], ["q"], 1)
