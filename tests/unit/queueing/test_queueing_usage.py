"""What a shard used (queueing.usage): tokens per mode, row errors by a bounded kind."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from queueing.usage import ERROR_KINDS, engine_settings, error_kind, shard_usage


@dataclass
class Embedded:
    num_tokens: int
    error: str | None = None


@dataclass
class Generated:
    num_prompt_tokens: int
    token_ids: list = field(default_factory=list)
    error: str | None = None


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


def test_engine_settings_are_the_engines_own_under_the_model_key():
    @dataclass
    class Loaded:
        settings: dict

    engine = Loaded({"mode": "embed", "device": "cpu", "max_batch_tokens": 2048})
    assert engine_settings(engine, "minilm") == {"model": "minilm", "mode": "embed", "device": "cpu",
                                                 "max_batch_tokens": 2048}
