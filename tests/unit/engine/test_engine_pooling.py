"""pool / finish on fabricated packed hidden states: no text's tokens reach another's vector."""

import pytest
import torch

from engine.layers.pooling import finish, pool

# Two texts end to end: 3 tokens, then 2.
HIDDEN = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0],
                       [1.0, 0.0], [3.0, 8.0]])
SEQ_LENS = torch.tensor([3, 2])


@pytest.mark.parametrize("mode, expected", [
    ("mean", [[3.0, 4.0], [2.0, 4.0]]),
    ("cls", [[1.0, 2.0], [1.0, 0.0]]),
    ("max", [[5.0, 6.0], [3.0, 8.0]]),
    ("lasttoken", [[5.0, 6.0], [3.0, 8.0]]),
    ("mean_sqrt_len_tokens", [[9.0 / 3**0.5, 12.0 / 3**0.5], [4.0 / 2**0.5, 8.0 / 2**0.5]]),
])
def test_pool_keeps_texts_apart(mode, expected):
    assert torch.allclose(pool(HIDDEN, SEQ_LENS, mode), torch.tensor(expected))


def test_pool_returns_float32_for_half_precision_hidden_states():
    assert pool(HIDDEN.bfloat16(), SEQ_LENS, "mean").dtype == torch.float32


def test_unknown_pooling_mode_is_refused():
    with pytest.raises(ValueError, match="weightedmean"):
        pool(HIDDEN, SEQ_LENS, "weightedmean")


def test_finish_truncates_then_normalises():
    pooled = torch.tensor([[3.0, 4.0, 12.0]])
    assert torch.allclose(finish(pooled, 2, normalize=True), torch.tensor([[0.6, 0.8]]))
    assert torch.allclose(finish(pooled, 2, normalize=False), torch.tensor([[3.0, 4.0]]))
    assert torch.allclose(finish(pooled, None, normalize=True), pooled / 13.0)
