"""Results-cache keys: what changes a namespace or a key, and what must not."""

from __future__ import annotations

import shutil

import pytest

from jobs.cache_keys import cache_namespace, keys_depend_on_row_id, model_revision, row_key
from jobs.spec import JobSpec


def spec(**changes) -> JobSpec:
    return JobSpec(**({"mode": "embed", "model": "minilm", "input": "in/", "output": "out/",
                       "incremental": True} | changes))


def test_namespace_changes_with_model_revision_mode_and_params_only():
    base = cache_namespace(spec(), "rev1")
    assert cache_namespace(spec(output="elsewhere/", input="other/", metadata={"a": 1}), "rev1") == base
    assert cache_namespace(spec(), "rev2") != base
    assert cache_namespace(spec(params={"dimensions": 128}), "rev1") != base
    assert cache_namespace(spec(params={"normalize": False}), "rev1") != base
    assert cache_namespace(spec(mode="generate", model="smollm2"), "rev1") != base
    assert cache_namespace(spec(quantization="fp8"), "rev1") != base
    assert cache_namespace(spec(quantization="fp8-block"), "rev1") != cache_namespace(spec(quantization="fp8"), "rev1")
    generate = cache_namespace(spec(mode="generate", model="smollm2"), "rev1")
    assert cache_namespace(spec(mode="generate", model="smollm2", kv_cache_dtype="fp8"), "rev1") != generate
    assert cache_namespace(spec(mode="generate", model="smollm2", kv_cache_dtype="auto"), "rev1") == generate
    # the check is a side measurement: results with and without it are the same results
    assert cache_namespace(spec(quantization="fp8", quant_check_rows=8), "rev1") == cache_namespace(
        spec(quantization="fp8"), "rev1")


def test_row_keys_separate_types_values_and_ids():
    assert row_key("hello") == row_key("hello")
    assert row_key("hello") != row_key("hello ")
    assert row_key("hello") != row_key(b"hello")
    assert row_key([{"role": "user", "content": "hi"}]) == row_key([{"content": "hi", "role": "user"}])
    assert row_key("hello", row_id=1) != row_key("hello", row_id=2) != row_key("hello")
    assert row_key(None) is None


def test_only_seeded_generation_keys_on_the_row_id():
    assert not keys_depend_on_row_id(spec())
    assert not keys_depend_on_row_id(spec(mode="generate", model="smollm2", params={"temperature": 0.0}))
    assert keys_depend_on_row_id(spec(mode="generate", model="smollm2", params={"seed": 7, "temperature": 0.8}))


def test_model_revision_follows_config_and_weights(tmp_path):
    from jobs.models import resolve_model
    folder = tmp_path / "model"
    shutil.copytree(resolve_model("minilm").path, folder)
    before = model_revision(folder)
    assert model_revision(folder) == before
    config = folder / "config.json"
    config.write_text(config.read_text().replace("}", ', "barge_note": 1}', 1))
    after_config = model_revision(folder)
    assert after_config != before
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF                  # the last byte: inside the sampled tail
    weights.write_bytes(bytes(data))
    assert model_revision(folder) != after_config


def test_incremental_must_be_a_boolean():
    with pytest.raises(ValueError, match="incremental: must be a boolean"):
        spec(incremental="yes")


def test_a_structured_jobs_namespace_changes_with_what_its_unset_options_mean(monkeypatch):
    """Compact JSON and no jump-forward became the defaults: the same params gave other text before."""
    import jobs.cache_keys
    structured = spec(mode="generate", model="smollm2", params={"structured": {"json_object": True}})
    free = spec(mode="generate", model="smollm2")
    before = cache_namespace(structured, "rev1"), cache_namespace(free, "rev1")
    monkeypatch.setattr(jobs.cache_keys, "STRUCTURED_DEFAULTS", jobs.cache_keys.STRUCTURED_DEFAULTS + 1)
    assert cache_namespace(structured, "rev1") != before[0] and cache_namespace(free, "rev1") == before[1]
