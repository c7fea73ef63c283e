"""A worker keeps one engine per EngineKey (model, mode, quantization, dtypes): an FP8 job and a 16-bit job
of the same model never run through the same engine, nor share a generate batch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jobs.models import resolve_model
from jobs.spec import JobSpec
from queueing.generate_feed import GenerateFeed
from queueing.runtime import EngineKey, Runtime


MINILM = resolve_model("minilm")


def _runtime() -> Runtime:
    return Runtime(settings=None, store=None, app=None, models={MINILM.key: MINILM})


def test_the_fp8_and_the_16_bit_engine_of_one_model_are_kept_apart():
    # Given a worker serving MiniLM
    runtime = _runtime()
    # When a 16-bit job and an FP8 job each ask for its engine
    plain_key, fp8_key = EngineKey(MINILM.key, "embed"), EngineKey(MINILM.key, "embed", "fp8")
    plain = runtime.engine_for(plain_key)
    fp8 = runtime.engine_for(fp8_key)
    # Then they are two engines, each loaded once and kept
    assert plain is not fp8
    assert runtime.engine_for(EngineKey(MINILM.key, "embed")) is plain
    assert runtime.engine_for(EngineKey(MINILM.key, "embed", "fp8")) is fp8
    assert set(runtime.engines) == {plain_key, fp8_key} and fp8_key.baseline == plain_key
    assert runtime.engine_settings(plain_key)["quantization"] is None
    assert runtime.engine_settings(fp8_key)["quantization"] == "fp8"


def test_a_baseline_engine_is_loaded_but_not_kept():
    runtime = _runtime()
    baseline = runtime.load_engine(EngineKey(MINILM.key, "embed"))
    assert baseline.settings["quantization"] is None
    assert runtime.engines == {}


def _job(quantization: str | None, model_key: str = "smollm2", kv_cache_dtype: str | None = None,
         mode: str = "generate") -> SimpleNamespace:
    spec = JobSpec(mode=mode, model=model_key, input="in/", output="out/", quantization=quantization,
                   kv_cache_dtype=kv_cache_dtype)
    return SimpleNamespace(model_key=model_key, spec=spec)


def _work(quantization: str | None, model_key: str = "smollm2", kv_cache_dtype: str | None = None,
          mode: str = "generate") -> SimpleNamespace:
    return SimpleNamespace(job=_job(quantization, model_key, kv_cache_dtype, mode))


def _feed(quantization: str | None = None, kv_cache_dtype: str | None = None) -> GenerateFeed:
    return GenerateFeed(SimpleNamespace(llm=None), EngineKey("smollm2", "generate", quantization,
                                                             kv_cache_dtype=kv_cache_dtype))


@pytest.mark.parametrize("job, key", [
    (_job(None), EngineKey("smollm2", "generate")),
    (_job("fp8"), EngineKey("smollm2", "generate", "fp8")),
    (_job(None, kv_cache_dtype="auto"), EngineKey("smollm2", "generate")),   # "auto" is the model's dtype
    (_job(None, kv_cache_dtype="fp8"), EngineKey("smollm2", "generate", kv_cache_dtype="fp8")),
    (_job(None, mode="embed"), EngineKey("smollm2", "embed")),
])
def test_a_jobs_engine_key_is_its_model_mode_quantization_and_dtypes(job, key):
    assert EngineKey.for_job(job) == key


def test_a_generate_feed_serves_only_its_own_quantization():
    feed = _feed("fp8")
    assert feed.serves(_work("fp8"))
    assert not feed.serves(_work(None))
    assert not feed.serves(_work("fp8-block"))
    assert not feed.serves(_work("fp8", model_key="other"))
    assert _feed().serves(_work(None))
    assert not _feed().serves(_work(None, mode="embed"))


def test_a_generate_feed_serves_only_its_own_kv_cache_dtype():
    fp8_kv = _feed(kv_cache_dtype="fp8")
    assert fp8_kv.serves(_work(None, kv_cache_dtype="fp8"))
    assert not fp8_kv.serves(_work(None)) and not fp8_kv.serves(_work(None, kv_cache_dtype="auto"))
    assert not _feed().serves(_work(None, kv_cache_dtype="fp8"))


def test_an_fp8_kv_cache_job_gets_its_own_generate_engine(tmp_path):
    # Given a worker serving a (random) Llama
    pytest.importorskip("transformers")
    from jobs.models import ModelRef
    from tests.support.random_decoders import save_random_decoder
    ref = ModelRef("random-llama", str(save_random_decoder(tmp_path / "llama", "llama")))
    runtime = Runtime(settings=None, store=None, app=None, models={ref.key: ref})
    # When a job with the model's cache and one with kv_cache_dtype="fp8" ask for its engine
    plain_key, fp8_kv_key = EngineKey(ref.key, "generate"), EngineKey(ref.key, "generate", kv_cache_dtype="fp8")
    plain = runtime.engine_for(plain_key)
    fp8_kv = runtime.engine_for(fp8_kv_key)
    # Then they are two engines, kept apart by the key, each reporting its cache
    assert plain is not fp8_kv and runtime.engine_for(EngineKey(ref.key, "generate", kv_cache_dtype="fp8")) is fp8_kv
    assert set(runtime.engines) == {plain_key, fp8_kv_key}
    assert runtime.engine_settings(plain_key)["kv_cache_dtype"] == "float32"
    assert runtime.engine_settings(fp8_kv_key)["kv_cache_dtype"] == "float8_e4m3fn"


def test_barge_prefix_order_0_gives_the_worker_a_first_come_first_served_generate_engine(tmp_path):
    # Given a worker serving a (random) Llama, started with BARGE_PREFIX_ORDER=0 and one without
    pytest.importorskip("transformers")
    from jobs.models import ModelRef
    from queueing.runtime import WorkerOptions
    from tests.support.random_decoders import save_random_decoder
    ref = ModelRef("random-llama", str(save_random_decoder(tmp_path / "llama", "llama")))
    key = EngineKey(ref.key, "generate")
    engines = {}
    for value in ("0", "1"):
        options = WorkerOptions.from_env({"BARGE_PREFIX_ORDER": value})
        runtime = Runtime(settings=None, store=None, app=None, models={ref.key: ref}, options=options)
        engines[value] = runtime.engine_for(key).llm.options
    # Then the first orders nothing by prefix and holds nothing back; the second does both (the default)
    assert (engines["0"].order_by_prefix, engines["0"].prefix_aware_admission) == (False, False)
    assert (engines["1"].order_by_prefix, engines["1"].prefix_aware_admission) == (True, True)
    assert WorkerOptions.from_env({}).prefix_order is True
    with pytest.raises(ValueError, match="BARGE_PREFIX_ORDER: 'off' is not 0 or 1"):
        WorkerOptions.from_env({"BARGE_PREFIX_ORDER": "off"})
