"""A worker keeps one engine per (model, mode, quantization): an FP8 job and a 16-bit job
of the same model never run through the same engine, nor share a generate batch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jobs.models import resolve_model
from jobs.spec import JobSpec
from queueing.generate_feed import GenerateFeed
from queueing.runtime import Runtime


MINILM = resolve_model("minilm")


def _runtime() -> Runtime:
    return Runtime(settings=None, store=None, app=None, models={MINILM.key: MINILM})


def test_the_fp8_and_the_16_bit_engine_of_one_model_are_kept_apart():
    # Given a worker serving MiniLM
    runtime = _runtime()
    # When a 16-bit job and an FP8 job each ask for its engine
    plain = runtime.engine_for(MINILM.key, "embed")
    fp8 = runtime.engine_for(MINILM.key, "embed", "fp8")
    # Then they are two engines, each loaded once and kept
    assert plain is not fp8
    assert runtime.engine_for(MINILM.key, "embed") is plain
    assert runtime.engine_for(MINILM.key, "embed", "fp8") is fp8
    assert set(runtime.engines) == {(MINILM.key, "embed", None), (MINILM.key, "embed", "fp8")}
    assert runtime.engine_settings(MINILM.key, "embed")["quantization"] is None
    assert runtime.engine_settings(MINILM.key, "embed", "fp8")["quantization"] == "fp8"


def test_a_baseline_engine_is_loaded_but_not_kept():
    runtime = _runtime()
    baseline = runtime.load_engine(MINILM.key, "embed")
    assert baseline.settings["quantization"] is None
    assert runtime.engines == {}


def _work(quantization: str | None, model_key: str = "smollm2", kv_cache_dtype: str | None = None) -> SimpleNamespace:
    spec = JobSpec(mode="generate", model=model_key, input="in/", output="out/", quantization=quantization,
                   kv_cache_dtype=kv_cache_dtype)
    return SimpleNamespace(job=SimpleNamespace(model_key=model_key, spec=spec))


def test_a_generate_feed_serves_only_its_own_quantization():
    feed = GenerateFeed(SimpleNamespace(llm=None), "smollm2", "fp8")
    assert feed.serves(_work("fp8"))
    assert not feed.serves(_work(None))
    assert not feed.serves(_work("fp8-block"))
    assert not feed.serves(_work("fp8", model_key="other"))
    assert GenerateFeed(SimpleNamespace(llm=None), "smollm2").serves(_work(None))


def test_a_generate_feed_serves_only_its_own_kv_cache_dtype():
    fp8_kv = GenerateFeed(SimpleNamespace(llm=None), "smollm2", None, "fp8")
    assert fp8_kv.serves(_work(None, kv_cache_dtype="fp8"))
    assert not fp8_kv.serves(_work(None)) and not fp8_kv.serves(_work(None, kv_cache_dtype="auto"))
    assert not GenerateFeed(SimpleNamespace(llm=None), "smollm2").serves(_work(None, kv_cache_dtype="fp8"))


def test_an_fp8_kv_cache_job_gets_its_own_generate_engine(tmp_path):
    # Given a worker serving a (random) Llama
    pytest.importorskip("transformers")
    from jobs.models import ModelRef
    from tests.support.random_decoders import save_random_decoder
    ref = ModelRef("random-llama", str(save_random_decoder(tmp_path / "llama", "llama")))
    runtime = Runtime(settings=None, store=None, app=None, models={ref.key: ref})
    # When a job with the model's cache and one with kv_cache_dtype="fp8" ask for its engine
    plain = runtime.engine_for(ref.key, "generate")
    fp8_kv = runtime.engine_for(ref.key, "generate", kv_cache_dtype="fp8")
    # Then they are two engines, kept apart by the key, each reporting its cache
    assert plain is not fp8_kv and runtime.engine_for(ref.key, "generate", kv_cache_dtype="fp8") is fp8_kv
    assert set(runtime.engines) == {(ref.key, "generate", None), (ref.key, "generate", None, "fp8")}
    assert runtime.engine_settings(ref.key, "generate")["kv_cache_dtype"] == "float32"
    assert runtime.engine_settings(ref.key, "generate", kv_cache_dtype="fp8")["kv_cache_dtype"] == "float8_e4m3fn"
