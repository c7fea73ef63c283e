"""A job's LoRA adapters as the jobs layer sees them (issue 44): JobSpec.adapter and
params.adapter_column checked without data, each row's adapter from its column, the
results cache keyed by the adapter, the worker's engine key, many hosts, `barge submit
--adapter`, and the torch-free check of an adapter's tensors against a base's config.json."""

from __future__ import annotations

import io
import json
import struct
from types import SimpleNamespace

import pytest

from cli.job import submitted_spec
from cli.main import _parser
from engine.lora.adapter_config import AdapterError
from engine.lora.adapter_shapes import check_tensor_shapes, read_tensor_shapes
from jobs.cache_keys import cache_namespace
from jobs.hosts import check_job_locations
from jobs.row_params import row_adapters, row_overrides
from jobs.settings import Settings
from jobs.spec import JobSpec, JobSpecError
from jobs.validate import sampling_kwargs
from queueing.runtime import EngineKey, WorkerOptions

GENERATE = dict(mode="generate", model="smollm2", input="in/", output="out/")
PREFIX = "base_model.model.model.layers"
# a Llama base: hidden 64, 4 heads of 16 (2 for k/v), MLP 128, 2 layers
BASE = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2}


@pytest.mark.parametrize("fields, field, message", [
    ({"mode": "embed", "model": "minilm"}, "adapter", "generate jobs only"),
    ({"params": {"adapter_column": "adapter"}}, "adapter", "not both"),
    ({"adapter": " "}, "adapter", "non-empty"),
])
def test_a_job_adapter_is_refused_naming_the_field(fields, field, message):
    spec = {**GENERATE, "adapter": "adapters/a", **fields}
    with pytest.raises(JobSpecError, match=message) as refused:
        JobSpec(**spec)
    assert refused.value.field == field


def test_barge_submit_adapter_is_the_jobs_adapter():
    args = ["submit", "--mode", "generate", "--model", "smollm2", "--input", "in/", "--output", "out/"]
    assert submitted_spec(_parser().parse_args(args + ["--adapter", "s3://adapters/a/"])).adapter == "s3://adapters/a/"
    assert submitted_spec(_parser().parse_args(args)).adapter is None
    column = submitted_spec(_parser().parse_args(args + ["--param", "adapter_column=adapter"]))
    assert column.params == {"adapter_column": "adapter"}


def test_an_adapter_column_is_a_generate_param_only():
    assert JobSpec(**GENERATE, params={"adapter_column": "adapter"}).params["adapter_column"] == "adapter"
    with pytest.raises(JobSpecError) as refused:
        JobSpec(mode="embed", model="minilm", input="in/", output="out/", params={"adapter_column": "adapter"})
    assert refused.value.field == "params.adapter_column"
    with pytest.raises(JobSpecError) as refused:
        JobSpec(**GENERATE, params={"adapter_column": 3})
    assert refused.value.field == "params.adapter_column"


def test_each_row_names_its_adapter_as_text_and_null_is_the_base():
    params = {"adapter_column": "adapter", "params_column": "p"}
    overrides, errors = row_overrides(params, {"adapter": ["a/", None, "s3://b/c", "", "a/"],
                                               "p": ['{"max_tokens": 3}', None, None, None, '{"adapter": "x"}']})
    assert overrides[:3] == [{"adapter": "a/", "max_tokens": 3}, {}, {"adapter": "s3://b/c"}]
    assert "empty string" in errors[3] and "params.adapter_column" in errors[3]
    assert "adapter_column" in errors[4], "a params column does not name an adapter"
    assert row_adapters(None, overrides[:3], 3) == ["a/", None, "s3://b/c"]


def test_a_jobs_adapter_is_every_rows_and_no_adapter_is_none():
    assert row_adapters("a/", None, 2) == ["a/", "a/"]
    assert row_adapters("a/", [{}, {"max_tokens": 2}], 2) == ["a/", "a/"]
    assert row_adapters(None, None, 3) is None and row_adapters(None, [{}, {}], 2) is None


def test_a_rows_adapter_is_no_sampling_param():
    assert sampling_kwargs({"max_tokens": 4, "adapter_column": "adapter", "adapter": "a/"}) == {"max_tokens": 4}


def test_the_results_cache_is_keyed_by_the_adapter_and_base_jobs_keep_their_keys():
    spec = JobSpec(**GENERATE, adapter="a/", params={"max_tokens": 4})
    base = JobSpec(**GENERATE, params={"max_tokens": 4})
    assert cache_namespace(spec, "rev") == cache_namespace(base, "rev"), "the identity is the files', not the path"
    assert cache_namespace(spec, "rev", "hash-a") != cache_namespace(spec, "rev", "hash-b")
    assert cache_namespace(spec, "rev", "hash-a") != cache_namespace(base, "rev")


def test_an_engine_with_lora_slots_is_another_engine():
    def key(**spec_fields):
        return EngineKey.for_job(SimpleNamespace(model_key="smollm2", spec=JobSpec(**GENERATE, **spec_fields)))
    assert key() == EngineKey("smollm2", "generate") and not key().lora
    assert key(adapter="a/").lora and key(params={"adapter_column": "adapter"}).lora
    assert key(adapter="a/") == key(params={"adapter_column": "adapter"}) != key()


def test_the_lora_settings_come_from_the_environment(tmp_path):
    assert Settings.from_env({"BARGE_DATA_DIR": str(tmp_path)}).max_lora_rank == 16
    assert Settings.from_env({"BARGE_DATA_DIR": str(tmp_path), "BARGE_MAX_LORA_RANK": "64"}).max_lora_rank == 64
    for bad in ("0", "129", "x"):
        with pytest.raises(ValueError, match="BARGE_MAX_LORA_RANK"):
            Settings.from_env({"BARGE_DATA_DIR": str(tmp_path), "BARGE_MAX_LORA_RANK": bad})
    assert WorkerOptions.from_env({"BARGE_MAX_LORAS": "4"}).max_loras == 4


def test_on_many_hosts_a_local_adapter_is_refused(tmp_path):
    many = {"BARGE_DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/x", "BARGE_BROKER_URL": "amqp://h//",
            "BARGE_SINGLE_HOST": "0"}
    settings = Settings.from_env({"BARGE_DATA_DIR": str(tmp_path), **many})
    remote = dict(GENERATE, input="s3://corpus/in/", output="s3://corpus/out/")
    check_job_locations(JobSpec(**remote, adapter="s3://adapters/a/"), settings, many)
    with pytest.raises(JobSpecError, match="BARGE_SHARED_PATHS") as refused:
        check_job_locations(JobSpec(**remote, adapter=str(tmp_path / "a")), settings, many)
    assert refused.value.field == "adapter"
    check_job_locations(JobSpec(**remote, adapter=str(tmp_path / "a")), settings,
                        {**many, "BARGE_SHARED_PATHS": str(tmp_path)})


def header(shapes: dict[str, list[int]]) -> io.BytesIO:
    """A safetensors file's header (its data left out: only the header is read)."""
    tensors = {name: {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]} for name, shape in shapes.items()}
    raw = json.dumps({"__metadata__": {"format": "pt"}, **tensors})
    return io.BytesIO(struct.pack("<Q", len(raw)) + raw.encode())


def pair(layer: int, module: str, a_shape: list[int], b_shape: list[int]) -> dict[str, list[int]]:
    return {f"{PREFIX}.{layer}.{module}.lora_A.weight": a_shape, f"{PREFIX}.{layer}.{module}.lora_B.weight": b_shape}


def q_and_down(rank: int, down_in: int = 128) -> dict[str, list[int]]:
    return {**pair(1, "self_attn.q_proj", [rank, 64], [64, rank]), **pair(0, "mlp.down_proj", [rank, down_in], [64, rank])}


def test_an_adapters_shapes_are_checked_from_its_header_against_the_bases_config():
    shapes = read_tensor_shapes(header(q_and_down(8)), "a")
    assert shapes[f"{PREFIX}.1.self_attn.q_proj.lora_A.weight"] == (8, 64)
    check_tensor_shapes(shapes, 8, BASE, "a")
    k_proj = pair(0, "self_attn.k_proj", [4, 64], [32, 4])   # 2 kv heads of 16
    check_tensor_shapes(read_tensor_shapes(header(k_proj), "a"), 4, BASE, "a")


@pytest.mark.parametrize("shapes, message", [
    (q_and_down(8, down_in=96), r"layers.0.down_proj.lora_A has shape \[8, 96\]; r=8 on this base model needs \[8, 128\]"),
    (pair(2, "self_attn.q_proj", [8, 64], [64, 8]), "for layer 2; the base model has 2 layers"),
    ({f"{PREFIX}.0.self_attn.q_proj.lora_A.weight": [8, 64]}, "has no lora_B"),
    ({"base_model.model.lm_head.lora_A.weight": [8, 64]}, "is not a LoRA weight"),
    ({}, "holds no LoRA weights"),
])
def test_an_adapter_that_does_not_fit_the_base_is_named(shapes, message):
    with pytest.raises(AdapterError, match=message):
        check_tensor_shapes(read_tensor_shapes(header(shapes), "a"), 8, BASE, "a")


def test_a_file_that_is_no_safetensors_is_refused():
    with pytest.raises(AdapterError, match="not a safetensors file"):
        read_tensor_shapes(io.BytesIO(b"\x01\x00"), "a")
    with pytest.raises(AdapterError, match="not a safetensors file"):
        read_tensor_shapes(io.BytesIO(struct.pack("<Q", 5) + b"nope!"), "a")
