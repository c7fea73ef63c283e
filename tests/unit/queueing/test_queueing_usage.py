"""What a shard used (queueing.usage): tokens per mode, row errors by a bounded kind, and a
generate shard's prefill and rows per adapter."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from jobs.generate_usage import AdapterUsage, Prefill
from queueing.usage import ERROR_KINDS, engine_settings, error_kind, generate_usage, shard_usage


@dataclass
class Embedded:
    num_tokens: int
    error: str | None = None


@dataclass
class Generated:
    num_prompt_tokens: int
    token_ids: list = field(default_factory=list)
    error: str | None = None
    num_cached_tokens: int = 0


@pytest.mark.parametrize("message, kind", [
    ("text is null", "null_input"),
    ("prompt is null", "null_input"),
    ("text is not a string (got int)", "bad_type"),
    ("chat messages must each be {'role': str, 'content': str}", "bad_type"),
    ("prompt is empty", "empty_input"),
    ("text has no tokens", "empty_input"),
    ("text has 900 tokens, over the model's max_seq_length of 256 (refused because truncate=False)", "too_long"),
    ("prompt has 5000 tokens; the context holds 4096", "too_long"),
    ("the GPU caught fire", "other"),
])
def test_error_kinds_are_a_fixed_set_never_the_message(message, kind):
    assert error_kind(message) == kind and kind in ERROR_KINDS


def test_an_embed_shard_counts_its_tokens_and_errors_by_kind():
    outputs = [Embedded(7), Embedded(0, "text is null"), Embedded(12), Embedded(0, "text is null")]
    usage = shard_usage("minilm", "embed", outputs, {"device": "cpu"})
    assert (usage.num_rows, usage.rows_failed, usage.num_tokens) == (4, 2, 19)
    assert usage.error_kinds == {"null_input": 2}
    assert usage.device == "cpu"


def test_a_generate_shard_counts_prompt_and_output_tokens():
    outputs = [Generated(10, [1, 2, 3]), Generated(0, [], "prompt is empty")]
    usage = shard_usage("smollm2", "generate", outputs, {})
    assert (usage.num_tokens, usage.rows_failed, usage.device) == (13, 1, "unknown")


def test_a_generate_shard_counts_prefill_against_the_cache_and_rows_per_adapter():
    # Given rows of the base model and of two adapters, one of them failed, some served from the cache
    outputs = [Generated(10, [1, 2], num_cached_tokens=8), Generated(20, [1]), Generated(0, [], "prompt is empty"),
               Generated(30, [1, 2, 3], num_cached_tokens=16)]
    adapters = ["/adapters/sql", None, "/adapters/chat", "/adapters/sql"]
    # When the shard's usage is built
    usage = generate_usage(outputs, adapters, num_lower_bound=40)
    # Then: computed = prompt - cached, and every row counts under its adapter, the base's first
    assert usage.prefill == Prefill(60, 24, 40) and usage.prefill.num_computed_tokens == 36
    assert usage.adapters == (AdapterUsage(None, 1, 21), AdapterUsage("/adapters/chat", 1, 0),
                              AdapterUsage("/adapters/sql", 2, 45))
    assert sum(a.num_rows for a in usage.adapters) == len(outputs)
    assert sum(a.num_tokens for a in usage.adapters) == shard_usage("m", "generate", outputs, {}).num_tokens


def test_a_job_without_adapters_records_only_its_prefill():
    usage = generate_usage([Generated(10, [1])], None, num_lower_bound=None)
    assert usage.adapters == () and usage.prefill == Prefill(10, 0, None)
    assert shard_usage("m", "generate", [Generated(10, [1])], {}, usage).generate is usage


def test_engine_settings_are_the_engines_own_under_the_model_key():
    @dataclass
    class Loaded:
        settings: dict

    engine = Loaded({"mode": "embed", "device": "cpu", "max_batch_tokens": 2048})
    assert engine_settings(engine, "minilm") == {"model": "minilm", "mode": "embed", "device": "cpu",
                                                 "max_batch_tokens": 2048}
