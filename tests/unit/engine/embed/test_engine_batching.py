"""plan_batches, attention_groups, pack: the pure packing decisions."""

import pytest
import torch

from engine.embed.batching import AttentionGroup, attention_groups, cu_seqlens, pack, plan_batches


@pytest.mark.parametrize("lengths, budget, expected", [
    ([], 100, []),
    ([5], 100, [[0]]),
    ([3, 10, 5], 100, [[0, 2, 1]]),                 # shortest first, one batch
    ([10, 10, 10], 20, [[0, 1], [2]]),              # 10 + 10 fits, 10 + 10 + 10 does not
    ([3, 3, 3, 50], 20, [[0, 1, 2], [3]]),          # real tokens count, not padded ones
    ([12, 3, 3, 9], 20, [[1, 2, 3], [0]]),          # 3 + 3 + 9 = 15; 15 + 12 is over
    ([300, 4], 100, [[1], [0]]),                    # over budget: a batch of its own
])
def test_plan_batches(lengths, budget, expected):
    assert plan_batches(lengths, budget) == expected


def test_every_row_is_planned_once_and_batches_fit_the_budget():
    lengths = [(i * 37) % 120 + 1 for i in range(500)]
    batches = plan_batches(lengths, 1024)
    assert sorted(i for batch in batches for i in batch) == list(range(500))
    for batch in batches:
        assert sum(lengths[i] for i in batch) <= 1024
    # Packing, not padding: every batch but the last is nearly full.
    assert all(sum(lengths[i] for i in batch) > 1024 - 120 for batch in batches[:-1])


def test_non_positive_budget_is_refused():
    with pytest.raises(ValueError, match="max_batch_tokens"):
        plan_batches([1], 0)


@pytest.mark.parametrize("seq_lens, expected", [
    ([], ()),
    ([4], (AttentionGroup(0, 1, 4),)),
    ([2, 2, 3, 5, 5, 5], (AttentionGroup(0, 2, 2), AttentionGroup(4, 1, 3), AttentionGroup(7, 3, 5))),
    ([3, 2, 3], (AttentionGroup(0, 1, 3), AttentionGroup(3, 1, 2), AttentionGroup(5, 1, 3))),
])
def test_attention_groups_are_runs_of_equal_length(seq_lens, expected):
    groups = attention_groups(seq_lens)
    assert groups == expected
    assert sum(group.num_tokens for group in groups) == sum(seq_lens)


def test_pack_lays_texts_end_to_end_in_the_order_given():
    token_ids = [[101, 7, 102], [101, 102], [101, 8, 9, 102]]
    batch = pack(token_ids, [1, 0, 2])
    assert batch.rows == [1, 0, 2]
    assert batch.input_ids.tolist() == [101, 102, 101, 7, 102, 101, 8, 9, 102]
    assert batch.positions.tolist() == [0, 1, 0, 1, 2, 0, 1, 2, 3]
    assert batch.seq_lens.tolist() == [2, 3, 4]
    assert batch.num_tokens == 9
    assert batch.input_ids.dtype == batch.positions.dtype == torch.long
    assert batch.cu_seqlens.tolist() == [0, 2, 5, 9] and batch.cu_seqlens.dtype == torch.int32


@pytest.mark.parametrize("seq_lens, expected", [
    ([], [0]),
    ([4], [0, 4]),
    ([2, 2, 3, 5, 5, 5], [0, 2, 4, 7, 12, 17, 22]),
])
def test_cu_seqlens_are_where_each_text_of_the_groups_starts(seq_lens, expected):
    assert cu_seqlens(attention_groups(seq_lens)).tolist() == expected
