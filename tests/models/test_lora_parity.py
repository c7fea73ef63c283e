"""LoRA adapters on the real SmolLM2-135M-Instruct (its Q4_1 GGUF, dequantized, fp32): Barge's
engine against transformers + PEFT on the same base and the same adapters.

No real adapter installs here, so the adapters are random ones made with peft on the
transformers model (tests/support/lora_adapters.py): lora_B drawn at a scale that moves the
greedy text without turning it into noise. Greedy tokens must be identical to PeftModel's
and to the merged model's (merge_and_unload), for ranks 8 and 64 on attention and MLP;
the GGUF's q/k rows are in Hugging Face's order on both sides, so the same adapter applies
unchanged. A batch mixing four adapters and the base gives each row what its adapter gives
alone."""

import copy

import pytest
import torch

from tests.support import smollm2

smollm2.require()
peft = pytest.importorskip("peft")

from engine.generate.llm_engine import LLMEngine  # noqa: E402
from engine.generate.options import GenerateOptions  # noqa: E402
from engine.generate.sampling_params import SamplingParams  # noqa: E402
from engine.lora.options import LoraOptions  # noqa: E402
from tests.support.lora_adapters import ATTENTION, MLP, save_random_adapter  # noqa: E402

pytestmark = pytest.mark.xdist_group(smollm2.GROUP)   # one reference load for the four modules
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Three things to pack for a hike:"]
MAX_TOKENS = 12
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
# name -> (rank, target modules, seed, lora_B scale, rsLoRA)
ADAPTERS = {"r8": (8, ATTENTION + MLP, 1, 0.02, False), "r64": (64, ATTENTION + MLP, 2, 0.01, False),
            "r16-attention-rslora": (16, ATTENTION, 3, 0.01, True), "r4-mlp": (4, MLP, 4, 0.03, False)}


@pytest.fixture(scope="module")
def reference():
    """The shared transformers model (tests/support/smollm2.py), copied: PeftModel wraps the
    model it is given in place, and the other modules' reference must stay the bare base."""
    return copy.deepcopy(smollm2.reference_model())


@pytest.fixture(scope="module")
def adapters(reference, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return {name: save_random_adapter(reference, root / name, rank, targets, seed, scale, use_rslora=rslora)
            for name, (rank, targets, seed, scale, rslora) in ADAPTERS.items()}


@pytest.fixture(scope="module")
def engine():
    return LLMEngine.load(smollm2.gguf_path(), torch.float32, torch.device("cpu"),
                          GenerateOptions(num_blocks=64, max_num_seqs=16),
                          lora=LoraOptions(max_loras=4, max_lora_rank=64))


def reference_tokens(model, engine, prompts: list[str]) -> list[list[int]]:
    tokens = []
    for prompt in prompts:
        ids = engine.tokenizer.encode(prompt)
        with torch.no_grad():
            output = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                    eos_token_id=None, pad_token_id=0)
        tokens.append(output[0, len(ids):].tolist())
    return tokens


@pytest.mark.parametrize("name", ["r8", "r64"])
def test_greedy_tokens_equal_peft_models_on_attention_and_mlp(engine, reference, adapters, name):
    """Given a random adapter on q/k/v/o and gate/up/down, when the engine serves it to a batch,
    then each row's greedy tokens are PeftModel's, and the adapter changed them."""
    ours = [output.token_ids for output in engine.generate(PROMPTS, GREEDY, adapter=adapters[name])]
    peft_model = peft.PeftModel.from_pretrained(reference, adapters[name]).eval()
    try:
        assert ours == reference_tokens(peft_model, engine, PROMPTS)
    finally:
        peft_model.unload()
    base = [output.token_ids for output in engine.generate(PROMPTS, GREEDY)]
    assert ours != base and base == reference_tokens(reference, engine, PROMPTS)


def test_greedy_tokens_equal_the_merged_model(engine, reference, adapters):
    """merge_and_unload folds B A scaling into the weights: the unmerged deltas give the same tokens."""
    merged = peft.PeftModel.from_pretrained(copy.deepcopy(reference), adapters["r64"]).merge_and_unload().eval()
    ours = [output.token_ids for output in engine.generate(PROMPTS, GREEDY, adapter=adapters["r64"])]
    assert ours == reference_tokens(merged, engine, PROMPTS)


def test_a_batch_of_four_adapters_and_the_base_equals_each_alone(engine, adapters):
    """Rows interleaved over four adapters (ranks 4 to 64, attention only, MLP only, rsLoRA) and
    the base, in one batch: each row's tokens are those of its adapter run alone."""
    names = [None, *ADAPTERS]
    rows = [(prompt, name) for prompt in PROMPTS for name in names]
    mixed = engine.generate([prompt for prompt, _ in rows], GREEDY,
                            adapter=[None if name is None else adapters[name] for _, name in rows])
    alone = {name: engine.generate(PROMPTS, GREEDY, adapter=None if name is None else adapters[name])
             for name in names}
    for (prompt, name), output in zip(rows, mixed):
        assert output.token_ids == alone[name][PROMPTS.index(prompt)].token_ids, (prompt, name)
    assert len({tuple(tuple(output.token_ids) for output in outputs) for outputs in alone.values()}) == len(names)
