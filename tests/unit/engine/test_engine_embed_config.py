"""The embed config of a model folder, per family, read from its JSON files alone (no weights)."""

import json

import pytest

from engine.config import is_embedding_folder, load_encoder_config
from engine.models.modernbert import modernbert_config_from_hf

QWEN3 = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 512, "hidden_size": 64,
         "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 32, "max_position_embeddings": 32768}
MODERNBERT = {"model_type": "modernbert", "vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152,
              "num_hidden_layers": 4, "num_attention_heads": 12, "max_position_embeddings": 8192}


def model_folder(path, config: dict, files: dict[str, dict] | None = None):
    """config.json plus other JSON files by name."""
    for name, content in {"config.json": config, **(files or {})}.items():
        (path / name).write_text(json.dumps(content))
    return path


def test_an_llm_embedder_pools_its_last_token(tmp_path):
    folder = model_folder(tmp_path, QWEN3, {"sentence_bert_config.json": {"max_seq_length": 8192}})
    config = load_encoder_config(folder)
    assert (config.family, config.pooling, config.max_seq_length, config.hidden_size) == ("decoder", "lasttoken", 8192, 64)
    assert config.architecture.qk_norm and config.architecture.num_kv_heads == 2


def test_a_tokenizer_limit_below_the_positions_caps_max_seq_length(tmp_path):
    model_folder(tmp_path, QWEN3, {"tokenizer_config.json": {"model_max_length": 512}})
    assert load_encoder_config(tmp_path).max_seq_length == 512


def test_a_max_seq_length_past_the_sliding_window_is_refused(tmp_path):
    model_folder(tmp_path, {**QWEN3, "model_type": "mistral", "sliding_window": 4096},
                 {"sentence_bert_config.json": {"max_seq_length": 8192}})
    with pytest.raises(ValueError, match=r"max_seq_length 8192 is outside 1..4096"):
        load_encoder_config(tmp_path)


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


@pytest.mark.parametrize("config, has_modules_json, expected", [
    ({"model_type": "bert"}, False, True),
    ({"model_type": "modernbert"}, False, True),
    ({"model_type": "qwen3"}, False, False),        # a plain LLM generates
    ({"model_type": "qwen3"}, True, True),          # Qwen3-Embedding: sentence-transformers files
    ({"model_type": "t5"}, False, False),
])
def test_is_embedding_folder(tmp_path, config, has_modules_json, expected):
    model_folder(tmp_path, config, {"modules.json": []} if has_modules_json else None)
    assert is_embedding_folder(tmp_path) is expected
