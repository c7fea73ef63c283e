"""JobSpec: every check that needs no data, each reported as a JobSpecError naming the field."""

from __future__ import annotations

import json

import pytest

from jobs.spec import JobSpec, JobSpecError

VALID = dict(mode="embed", model="minilm", input="/data/in/*.parquet", output="/data/out/")


def spec(**changes) -> JobSpec:
    return JobSpec(**{**VALID, **changes})


def test_a_minimal_spec_gets_the_defaults():
    job = spec()
    assert job.input_column == "text"
    assert job.id_column is None
    assert job.webhook_url is None
    assert job.params == {} and job.metadata == {}
    assert job.if_exists == "error"
    assert job.max_rows_per_shard == 2048
    assert job.quantization is None and job.quant_check_rows == 0


@pytest.mark.parametrize("changes, field, words", [
    # mode
    (dict(mode="summarize"), "mode", "unknown mode 'summarize'"),
    (dict(mode=""), "mode", "unknown mode"),
    (dict(mode="transcribe", params={"beam": 2}), "params.beam", "unknown parameter for mode 'transcribe'"),
    (dict(mode="transcribe", params={"vad": "yes"}), "params.vad", "must be a boolean"),
    (dict(mode="transcribe", params={"beam_size": "5"}), "params.beam_size", "an integer from 1 (greedy) to 16"),
    (dict(mode="transcribe", params={"language": 7}), "params.language", "language code"),
    # required text fields
    (dict(model=""), "model", "non-empty"),
    (dict(model="   "), "model", "non-empty"),
    (dict(model=None), "model", "non-empty"),
    (dict(input=""), "input", "non-empty"),
    (dict(input=[]), "input", "no input"),
    (dict(input=()), "input", "no input"),
    (dict(input=["/a.parquet", ""]), "input", "non-empty"),
    (dict(input=["/a.parquet", 3]), "input", "non-empty"),
    (dict(output=""), "output", "non-empty"),
    (dict(input_column=""), "input_column", "non-empty"),
    (dict(id_column=""), "id_column", "non-empty"),
    # webhook_url
    (dict(webhook_url="ftp://example.com/hook"), "webhook_url", "scheme"),
    (dict(webhook_url="https:///hook"), "webhook_url", "no host"),
    (dict(webhook_url="https://user:pass@example.com/hook"), "webhook_url", "credentials"),
    (dict(webhook_url="https://user@example.com/hook"), "webhook_url", "credentials"),
    (dict(webhook_url="https://example.com:99999/hook"), "webhook_url", "port"),
    (dict(webhook_url="https://exa mple.com/"), "webhook_url", "whitespace"),
    (dict(webhook_url=""), "webhook_url", "non-empty"),
    # if_exists, max_rows_per_shard
    (dict(if_exists="overwrite"), "if_exists", "'overwrite'"),
    (dict(if_exists=None), "if_exists", "None"),
    (dict(max_rows_per_shard=0), "max_rows_per_shard", "positive"),
    (dict(max_rows_per_shard=-5), "max_rows_per_shard", "positive"),
    (dict(max_rows_per_shard=10.0), "max_rows_per_shard", "positive"),
    (dict(max_rows_per_shard="100"), "max_rows_per_shard", "positive"),
    (dict(max_rows_per_shard=True), "max_rows_per_shard", "positive"),
    # embed params
    (dict(params={"temperature": 0.0}), "params.temperature", "unknown parameter"),
    (dict(params={"dimensions": "x"}), "params.dimensions", "a positive integer or null"),
    (dict(params={"dimensions": 1.5}), "params.dimensions", "a positive integer or null"),
    (dict(params={"dimensions": True}), "params.dimensions", "a positive integer or null"),
    (dict(params={"dimensions": 0}), "params.dimensions", "positive"),
    (dict(params={"dimensions": -3}), "params.dimensions", "positive"),
    (dict(params={"normalize": 1}), "params.normalize", "a boolean"),
    (dict(params={"normalize": "yes"}), "params.normalize", "a boolean"),
    (dict(params={"normalize": None}), "params.normalize", "a boolean"),
    # opt-in webhook events, expiry
    (dict(webhook_url="https://example.com/h", webhook_events=("job.succeeded",)), "webhook_events",
     "'job.succeeded' is not one of job.progress, shard.completed"),
    (dict(webhook_url="https://example.com/h", webhook_events="job.progress"), "webhook_events", "a list"),
    (dict(webhook_events=("shard.completed",)), "webhook_events", "needs a webhook_url"),
    (dict(expires_after_s=0), "expires_after_s", "positive"),
    (dict(expires_after_s=-1.0), "expires_after_s", "positive"),
    (dict(expires_after_s="60"), "expires_after_s", "positive"),
    (dict(expires_after_s=True), "expires_after_s", "positive"),
    # FP8 weights and their quality check
    (dict(quantization="int8"), "quantization", "'int8' is not one of 'fp8', 'fp8-block', 'fp8-group' or null"),
    (dict(quantization="FP8"), "quantization", "is not one of"),
    (dict(quant_check_rows=64), "quant_check_rows", "it needs quantization"),
    (dict(quantization="fp8", quant_check_rows=-1), "quant_check_rows", "non-negative integer"),
    (dict(quantization="fp8", quant_check_rows=True), "quant_check_rows", "non-negative integer"),
    (dict(quantization="fp8", quant_check_rows="64"), "quant_check_rows", "non-negative integer"),
    # the FP8 KV cache: generate only
    (dict(mode="generate", kv_cache_dtype="int8"), "kv_cache_dtype", "'int8' is not one of 'auto', 'fp8' or null"),
    (dict(mode="generate", kv_cache_dtype="FP8"), "kv_cache_dtype", "is not one of"),
    (dict(kv_cache_dtype="fp8"), "kv_cache_dtype", "applies to generate jobs only, not mode 'embed'"),
    # structured output's options
    (dict(mode="generate", params={"structured_whitespace": "tabs"}), "params.structured_whitespace",
     'must be "compact" or "any", got \'tabs\''),
    (dict(mode="generate", params={"structured_whitespace": None}), "params.structured_whitespace",
     '"compact" or "any"'),
    (dict(mode="generate", params={"jump_forward": "on"}), "params.jump_forward", "a boolean"),
    (dict(params={"jump_forward": True}), "params.jump_forward", "unknown parameter for mode 'embed'"),
])
def test_a_bad_spec_is_refused_naming_the_field(changes, field, words):
    with pytest.raises(JobSpecError) as caught:
        spec(**changes)
    assert caught.value.field == field
    assert words in caught.value.problem
    assert str(caught.value).startswith(f"{field}: ")


def test_unknown_param_lists_the_known_ones():
    with pytest.raises(JobSpecError) as caught:
        spec(params={"top_k": 3})
    assert "normalize" in caught.value.problem and "dimensions" in caught.value.problem


def test_webhook_error_does_not_repeat_the_field_name():
    with pytest.raises(JobSpecError) as caught:
        spec(webhook_url="ftp://example.com/hook")
    assert str(caught.value).count("webhook_url") == 1


def test_job_spec_error_is_a_value_error():
    with pytest.raises(ValueError):
        spec(mode="nope")


@pytest.mark.parametrize("params", [
    {},
    {"normalize": False},
    {"dimensions": None},
    {"dimensions": 1},
    {"dimensions": 256, "normalize": True},
])
def test_good_embed_params_are_accepted(params):
    assert spec(params=params).params == params


@pytest.mark.parametrize("webhook_url", ["https://example.com/hooks/barge", "http://hooks.internal:8080/x?a=1"])
def test_good_webhook_urls_are_accepted(webhook_url):
    assert spec(webhook_url=webhook_url).webhook_url == webhook_url


def test_a_list_input_becomes_a_tuple():
    job = spec(input=["/a.parquet", "/b/*.parquet"])
    assert job.input == ("/a.parquet", "/b/*.parquet")
    assert job.inputs == ["/a.parquet", "/b/*.parquet"]
    hash(job.input)   # frozen all the way down for the input


def test_a_string_input_is_one_input():
    assert spec(input="/a.parquet").inputs == ["/a.parquet"]


def test_params_and_metadata_are_copied_from_the_caller():
    params, metadata = {"normalize": True}, {"run": 1}
    job = spec(params=params, metadata=metadata)
    params["dimensions"] = 0
    metadata["run"] = 2
    assert job.params == {"normalize": True}
    assert job.metadata == {"run": 1}


def test_a_spec_is_frozen():
    with pytest.raises(AttributeError):
        spec().model = "other"


@pytest.mark.parametrize("changes", [
    {},
    dict(input=["/a.parquet", "/b.parquet"]),
    dict(id_column="doc_id", input_column="body", webhook_url="https://example.com/h",
         params={"dimensions": 128, "normalize": False}, metadata={"night": "2026-12-01", "tags": ["a"]},
         if_exists="replace", max_rows_per_shard=7),
    dict(webhook_url="https://example.com/h", webhook_events=["job.progress", "shard.completed"],
         expires_after_s=3600),
    dict(quantization="fp8-block", quant_check_rows=32),
    dict(quantization="fp8-group"),
])
def test_to_dict_from_dict_roundtrip(changes):
    job = spec(**changes)
    data = job.to_dict()
    assert JobSpec.from_dict(data) == job
    assert isinstance(data["input"], (str, list))   # JSON-friendly: a tuple comes out as a list


def test_to_dict_is_json_serialisable():
    job = spec(input=["/a", "/b"], metadata={"k": [1, 2]})
    assert JobSpec.from_dict(json.loads(json.dumps(job.to_dict()))) == job


def test_from_dict_refuses_an_unknown_field():
    with pytest.raises(JobSpecError) as caught:
        JobSpec.from_dict({**VALID, "priority": 9, "color": "red"})
    assert caught.value.field == "color"   # the first, in sorted order
    assert "unknown field" in caught.value.problem


def test_from_dict_validates():
    with pytest.raises(JobSpecError) as caught:
        JobSpec.from_dict({**VALID, "mode": "summarize"})
    assert caught.value.field == "mode"


def test_the_kv_cache_dtype_of_a_generate_job_and_its_default_spelled_once():
    assert spec(mode="generate", kv_cache_dtype="fp8").kv_cache_dtype == "fp8"
    assert spec(mode="generate", kv_cache_dtype="auto").kv_cache_dtype is None     # as if not named
    assert spec(mode="generate").kv_cache_dtype is None
