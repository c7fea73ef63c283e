"""What config.json says about scoring a model: its head, and which scorer pairs need."""

import json

import pytest

from engine.score.head_config import head_config_from_hf, score_method


def test_a_bert_classifier_head():
    head = head_config_from_hf({"architectures": ["BertForSequenceClassification"], "model_type": "bert",
                                "id2label": {"0": "NEG", "1": "POS"}})
    assert (head.labels, head.num_labels, head.pooling, head.classify_activation) == (("NEG", "POS"), 2, "cls", "softmax")
    assert head.cross_encoder_activation == "none"        # CrossEncoder: Identity for more than one label


@pytest.mark.parametrize("hf, activation, cross_encoder", [
    ({"num_labels": 1}, "none", "sigmoid"),
    ({"id2label": {"0": "LABEL_0"}, "sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}},
     "none", "none"),
    ({"id2label": {"0": "LABEL_0"}, "sbert_ce_default_activation_function": "torch.nn.modules.activation.Sigmoid"},
     "none", "sigmoid"),
    ({"id2label": {"0": "a", "1": "b"}, "problem_type": "multi_label_classification"}, "sigmoid", "none"),
])
def test_activations_by_config(hf, activation, cross_encoder):
    head = head_config_from_hf({"architectures": ["XLMRobertaForSequenceClassification"], "model_type": "xlm-roberta",
                                **hf})
    assert (head.classify_activation, head.cross_encoder_activation) == (activation, cross_encoder)


def test_decoder_and_modernbert_pooling():
    llama = head_config_from_hf({"architectures": ["LlamaForSequenceClassification"], "model_type": "llama",
                                 "num_labels": 1, "pad_token_id": 2})
    assert (llama.pooling, llama.pad_token_id, llama.is_decoder) == ("last", 2, True)
    modern = head_config_from_hf({"architectures": ["ModernBertForSequenceClassification"], "model_type": "modernbert",
                                  "classifier_pooling": "mean", "classifier_bias": True})
    assert (modern.pooling, modern.classifier_bias, modern.classifier_activation) == ("mean", True, "gelu")


@pytest.mark.parametrize("hf, message", [
    ({"architectures": ["BertModel"], "model_type": "bert"}, "not a sequence classifier"),
    ({"architectures": ["GPT2ForSequenceClassification"], "model_type": "gpt2"}, "unsupported classifier model_type"),
    ({"architectures": ["BertForSequenceClassification"], "model_type": "bert", "problem_type": "ranking"},
     "unsupported problem_type"),
    ({"architectures": ["BertForSequenceClassification"], "model_type": "bert",
      "sentence_transformers": {"activation_fn": "my.module.Tanh"}}, "unsupported cross-encoder activation_fn"),
    ({"architectures": ["ModernBertForSequenceClassification"], "model_type": "modernbert",
      "classifier_pooling": "max"}, "classifier_pooling"),
])
def test_refused_heads(hf, message):
    with pytest.raises(ValueError, match=message):
        head_config_from_hf(hf)


@pytest.mark.parametrize("files, method", [
    ({"config.json": {"architectures": ["BertForSequenceClassification"], "model_type": "bert"}}, "cross-encoder"),
    ({"config.json": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}}, "yes-no"),
    ({"config.json": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}, "modules.json": []}, "bi-encoder"),
    ({"config.json": {"architectures": ["BertModel"], "model_type": "bert"}}, "bi-encoder"),
])
def test_score_method(tmp_path, files, method):
    for name, content in files.items():
        (tmp_path / name).write_text(json.dumps(content))
    assert score_method(tmp_path) == method


def test_a_gguf_file_is_a_yes_no_reranker_and_others_are_refused(tmp_path):
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    assert score_method(tmp_path / "model.gguf") == "yes-no"
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["WhisperForConditionalGeneration"],
                                                      "model_type": "whisper"}))
    with pytest.raises(ValueError, match="cannot score pairs"):
        score_method(tmp_path)
