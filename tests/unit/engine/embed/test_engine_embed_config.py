"""The embed config of a model folder, per family, read from its JSON files alone (no weights)."""

import json

import pytest

from engine.embed.config import EncoderConfig, is_embedding_folder, load_encoder_config
from engine.models.modernbert import modernbert_config_from_hf

QWEN3 = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 512, "hidden_size": 64,
         "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 32, "max_position_embeddings": 32768}
MODERNBERT = {"model_type": "modernbert", "vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152,
              "num_hidden_layers": 4, "num_attention_heads": 12, "max_position_embeddings": 8192}
INSTRUCTION = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"


def model_folder(path, config: dict, files: dict[str, dict] | None = None):
    """config.json plus other JSON files by name."""
    for name, content in {"config.json": config, **(files or {})}.items():
        (path / name).write_text(json.dumps(content))
    return path


def test_an_llm_embedder_pools_its_last_token_and_reads_its_prompts(tmp_path):
    folder = model_folder(tmp_path, QWEN3, {
        "config_sentence_transformers.json": {"prompts": {"query": INSTRUCTION, "document": ""}},
        "sentence_bert_config.json": {"max_seq_length": 8192}})
    config = load_encoder_config(folder)
    assert (config.family, config.pooling, config.max_seq_length, config.hidden_size) == ("decoder", "lasttoken", 8192, 64)
    assert config.architecture.qk_norm and config.architecture.num_kv_heads == 2
    assert config.prompt_for(None, "query") == INSTRUCTION


def test_a_tokenizer_limit_below_the_positions_caps_max_seq_length(tmp_path):
    model_folder(tmp_path, QWEN3, {"tokenizer_config.json": {"model_max_length": 512}})
    assert load_encoder_config(tmp_path).max_seq_length == 512


def test_a_max_seq_length_past_the_sliding_window_is_refused(tmp_path):
    model_folder(tmp_path, {**QWEN3, "model_type": "mistral", "sliding_window": 4096},
                 {"sentence_bert_config.json": {"max_seq_length": 8192}})
    with pytest.raises(ValueError, match=r"max_seq_length 8192 is outside 1..4096"):
        load_encoder_config(tmp_path)


def test_a_model_with_its_own_modeling_code_is_refused(tmp_path):
    """gte-Qwen2-instruct says qwen2 but attends bidirectionally in its own code."""
    model_folder(tmp_path, {**QWEN3, "model_type": "qwen2",
                            "auto_map": {"AutoModel": "Alibaba-NLP/gte-Qwen2--modeling_qwen.Qwen2Model"}})
    with pytest.raises(ValueError, match=r"maps AutoModel to remote code \(Alibaba-NLP/gte-Qwen2--modeling_qwen"):
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


def config_with_prompts(prompts=None, default=None, include_prompt=True) -> EncoderConfig:
    return EncoderConfig(model_name="m", model_type="qwen3", family="decoder", architecture=None, hidden_size=64,
                         max_positions=512, pooling="lasttoken", max_seq_length=512, do_lower_case=False,
                         prompts=prompts or {}, default_prompt_name=default, include_prompt=include_prompt)


@pytest.mark.parametrize("prompts, default, prompt, prompt_name, expected", [
    ({}, None, None, None, ""),
    ({}, None, "Instruct: x\nQuery:", None, "Instruct: x\nQuery:"),
    ({"query": "q: "}, None, None, "query", "q: "),
    ({"query": "q: "}, "query", None, None, "q: "),          # the folder's default applies
    ({"query": "q: "}, "query", "p: ", None, "p: "),          # an explicit prompt wins
    ({"query": "q: ", "document": ""}, "query", None, "document", ""),
])
def test_prompt_is_chosen_as_sentence_transformers_does(prompts, default, prompt, prompt_name, expected):
    assert config_with_prompts(prompts, default).prompt_for(prompt, prompt_name) == expected


@pytest.mark.parametrize("config, prompt, prompt_name, words", [
    (config_with_prompts({"query": "q: "}), "p: ", "query", "not both"),
    (config_with_prompts({"query": "q: "}), None, "passage", "prompt_name 'passage' is not one of"),
    (config_with_prompts(include_prompt=False), "p: ", None, "include_prompt"),
])
def test_bad_prompt_choices_are_refused(config, prompt, prompt_name, words):
    with pytest.raises(ValueError, match=words):
        config.prompt_for(prompt, prompt_name)


def test_a_default_prompt_name_must_exist():
    with pytest.raises(ValueError, match="default_prompt_name 'query'"):
        config_with_prompts({}, "query")


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
