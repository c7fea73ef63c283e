"""plan_batches: the pure packing decision."""

import pytest

from engine.batching import plan_batches


@pytest.mark.parametrize("lengths, budget, expected", [
    ([], 100, []),
    ([5], 100, [[0]]),
    ([3, 10, 5], 100, [[1, 2, 0]]),                 # longest first, one batch
    ([10, 10, 10], 20, [[0, 1], [2]]),              # 2 * 10 fits, 3 * 10 does not
    ([50, 3, 3, 3], 20, [[0], [1, 2, 3]]),          # the long row does not drag short ones along
    ([300, 4], 100, [[0], [1]]),                    # over budget: a batch of its own
])
def test_plan_batches(lengths, budget, expected):
    assert plan_batches(lengths, budget) == expected


def test_every_row_is_planned_once_and_batches_fit_the_budget():
    lengths = [(i * 37) % 120 + 1 for i in range(500)]
    batches = plan_batches(lengths, 1024)
    assert sorted(i for batch in batches for i in batch) == list(range(500))
    for batch in batches:
        assert len(batch) * max(lengths[i] for i in batch) <= 1024


def test_non_positive_budget_is_refused():
    with pytest.raises(ValueError, match="max_batch_tokens"):
        plan_batches([1], 0)
