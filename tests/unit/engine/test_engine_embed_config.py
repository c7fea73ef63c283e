"""The embed config of a model folder, per family, read from its JSON files alone (no weights)."""

import pytest

from engine.models.modernbert import modernbert_config_from_hf

MODERNBERT = {"model_type": "modernbert", "vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152,
              "num_hidden_layers": 4, "num_attention_heads": 12, "max_position_embeddings": 8192}


@pytest.mark.parametrize("keys, is_global, thetas", [
    ({}, (True, False, False, True), (160000.0, 10000.0)),                 # the defaults
    ({"global_attn_every_n_layers": 2, "global_rope_theta": 80000.0, "local_rope_theta": 5000.0},
     (True, False, True, False), (80000.0, 5000.0)),                       # ModernBERT-base's own keys
    ({"layer_types": ["full_attention", "full_attention", "sliding_attention", "full_attention"],
      "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
     (True, True, False, True), (1e6, 1e4)),                               # what transformers 5 writes
])
def test_modernbert_layer_kinds_and_rotary_thetas(keys, is_global, thetas):
    config = modernbert_config_from_hf({**MODERNBERT, **keys})
    assert config.is_global == is_global
    assert (config.global_rope_theta, config.local_rope_theta) == thetas
    assert (config.local_attention, config.head_dim, config.norm_bias) == (128, 64, False)


def test_modernbert_with_scaled_rotary_is_refused():
    rope = {"full_attention": {"rope_type": "yarn", "factor": 4.0}, "sliding_attention": {"rope_type": "default"}}
    with pytest.raises(ValueError, match="unsupported rope_type 'yarn'"):
        modernbert_config_from_hf({**MODERNBERT, "rope_parameters": rope})
