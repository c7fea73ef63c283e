"""Prefill figures (issue 47): prompt tokens computed per step (StepStats.num_prefill_tokens),
per generate() call (RunStats.num_prefill_tokens, num_prefill_lower_bound) and in the
worker's metrics (barge_prefill_tokens_total). A small random Llama on CPU."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

from engine import Engine, SamplingParams, StepStats  # noqa: E402
from engine.generate.prefix_order import plan_prefix_order  # noqa: E402
from queueing.metrics import WorkerMetrics  # noqa: E402
from tests.support.random_decoders import save_random_decoder  # noqa: E402


def templated_prompts() -> list[list[int]]:
    """Two 24-token templates (6 blocks of 4), 5 rows each with 3-9 tokens of their own, interleaved."""
    generator = torch.Generator().manual_seed(2)
    templates = [torch.randint(3, 500, (24,), generator=generator).tolist() for _ in range(2)]
    return [templates[row % 2] + torch.randint(3, 500, (3 + row % 7,), generator=generator).tolist()
            for row in range(10)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_random_decoder(tmp_path_factory.mktemp("llama") / "llama", "llama")


def run_counted(folder, prefix_aware: bool):
    """A generate() call of templated_prompts(); its RunStats and its steps' StepStats."""
    engine = Engine.from_pretrained(folder, mode="generate", num_blocks=64, block_size=4, max_num_batched_tokens=64,
                                    order_by_prefix=prefix_aware, prefix_aware_admission=prefix_aware)
    steps: list[StepStats] = []
    engine.add_step_observer(steps.append)
    engine.generate(templated_prompts(), SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    return engine.llm.last_run, steps


def test_steps_and_run_count_the_prompt_tokens_computed(folder):
    # Given / When: the same rows prefix-aware and first come, first served.
    prompts = templated_prompts()
    (run, steps), (fcfs, _) = run_counted(folder, True), run_counted(folder, False)
    # Then: steps add up to the run, computed and cached tokens to the prompts (no preemption here).
    assert run.num_preemptions == 0
    assert sum(stats.num_prefill_tokens for stats in steps) == run.num_prefill_tokens
    assert run.num_prefill_tokens + run.num_cached_tokens == run.num_prompt_tokens == sum(map(len, prompts))
    assert run.num_prefill_lower_bound == fcfs.num_prefill_lower_bound == plan_prefix_order(prompts).num_distinct_tokens
    # Within a block per row of the bound prefix-aware; above it first come, first served, where
    # a row admitted beside its template's first row computes template blocks again.
    assert run.num_prefill_lower_bound <= run.num_prefill_tokens <= run.num_prefill_lower_bound + 4 * len(prompts)
    assert fcfs.num_prefill_tokens > run.num_prefill_tokens


def test_the_worker_metrics_count_prefill_tokens():
    metrics, observers = WorkerMetrics(), []
    metrics.observe_engine(type("Observed", (), {"add_step_observer": lambda self, o: observers.append(o)})(),
                           "smollm2", "generate")
    observers[0](StepStats(4, 300, 128, 2048, 30, 1000, num_prefix_cache_hit_tokens=64, num_prefill_tokens=296))
    observers[0](StepStats(4, 4, 128, 2048, 30, 1000))
    counted = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
               for family in metrics.registry.collect() for sample in family.samples}
    assert counted[("barge_prefill_tokens_total", (("mode", "generate"), ("model", "smollm2")))] == 296
