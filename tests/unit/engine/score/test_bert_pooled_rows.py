"""A BERT classifier's last layer runs for the pooled [CLS] tokens alone: the same states
as the whole layer's at those rows (tests/models/test_score_parity.py holds the result
to transformers and sentence-transformers on real weights)."""

from __future__ import annotations

import pytest
import torch

from engine.embed.batching import pack
from engine.layers.packed_linear import can_pack, pack_linears
from engine.models.bert import BertConfig, BertModel
from engine.layers.pooling import first_rows

CONFIG = BertConfig(vocab_size=100, hidden_size=64, num_layers=3, num_heads=4, intermediate_size=128,
                    hidden_act="gelu", layer_norm_eps=1e-12, max_position_embeddings=64, type_vocab_size=2,
                    pad_token_id=0, position_offset=0)
TEXTS = [[1, 2, 3], [4, 5, 6], [7, 8, 9, 10, 11], [12, 13], [5, 5, 5, 5, 5], [9]]


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("with_types", [False, True])
def test_the_last_layer_for_the_first_tokens_alone_equals_the_whole_layer_there(packed, with_types):
    torch.manual_seed(0)
    model = BertModel(CONFIG).eval()
    if packed:
        if not can_pack(model):
            pytest.skip("oneDNN cannot pack linears on this CPU")
        assert pack_linears(model, batch_hint=16) > 0
    batch = pack(TEXTS, [3, 0, 1, 2, 4, 5])
    types = torch.randint(0, 2, (batch.num_tokens,)) if with_types else None
    rows = first_rows(batch.seq_lens)
    with torch.inference_mode():
        whole = model(batch, types)
        pooled = model(batch, types, rows=rows)
    assert pooled.shape == (len(TEXTS), CONFIG.hidden_size)
    assert torch.allclose(pooled, whole[rows], atol=1e-5)
    assert not torch.allclose(pooled, whole[rows.flip(0)], atol=1e-3)   # each text's own row
