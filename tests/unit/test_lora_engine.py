"""LoRA through the generate engine on small random decoders (the families Barge runs):
greedy parity with PEFT, the max_loras gate and the slots' LRU, the prefix cache keyed by
adapter, and a bad adapter as its row's error. SmolLM2's real-weight parity is
tests/models/test_lora_parity.py."""

from dataclasses import dataclass

import pytest
import torch

from engine.generate.llm_engine import LLMEngine
from engine.generate.options import GenerateOptions
from engine.generate.sampling_params import SamplingParams
from engine.lora.gate import admits
from engine.lora.options import LoraOptions
from tests.support.lora_adapters import ATTENTION, MLP, peft_greedy_tokens, save_random_adapter
from tests.support.random_decoders import save_random_decoder

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

CPU = torch.device("cpu")
PROMPTS = [[1, 5, 9, 33, 100, 7], [1, 42, 43, 44], [1, 300, 301, 302, 8, 9, 10, 11, 12]]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
# rank, targets: four different adapters, so that a mixed batch tells them apart
SHAPES = [(8, ATTENTION + MLP), (4, ["q_proj", "v_proj"]), (16, MLP), (2, ATTENTION)]


def build(tmp_path, family: str, lora: LoraOptions | None = LoraOptions(max_loras=4, max_lora_rank=16), **options):
    folder = save_random_decoder(tmp_path / family, family)
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    adapters = [save_random_adapter(reference, tmp_path / f"{family}-{index}", rank, targets, seed=index, scale=0.3)
                for index, (rank, targets) in enumerate(SHAPES)]
    engine = LLMEngine.load(folder, torch.float32, CPU, GenerateOptions(num_blocks=64, max_num_seqs=16, **options),
                            lora=lora)
    return engine, reference, adapters


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return build(tmp_path_factory.mktemp("llama"), "llama")


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
def test_greedy_tokens_equal_peft_in_every_family(tmp_path, family):
    """Qwen2's q/k/v biases, Qwen3's q/k norms and GQA's narrow k/v columns of the fused linear."""
    engine, reference, adapters = build(tmp_path, family)
    rows = [(prompt, adapter) for prompt in PROMPTS[:2] for adapter in adapters]
    outputs = engine.generate([prompt for prompt, _ in rows], GREEDY, adapter=[adapter for _, adapter in rows])
    for (prompt, adapter), output in zip(rows, outputs):
        assert output.token_ids == peft_greedy_tokens(reference, adapter, prompt, GREEDY.max_tokens), (family, adapter.name)


def test_a_batch_never_holds_more_than_max_loras_adapters(tmp_path):
    """Four adapters over rows in input order with max_loras 2: the scheduler admits a third
    adapter only once one has left the batch, slots are reused (LRU), and every row's tokens
    are those of its adapter run alone."""
    engine, _, adapters = build(tmp_path, "llama", LoraOptions(max_loras=2, max_lora_rank=16))
    seen = []
    batch_for = engine.lora.batch_for
    engine.lora.batch_for = lambda step_adapters, counts: (
        seen.append(len({a.adapter_id for a in step_adapters if a is not None})) or batch_for(step_adapters, counts))
    rows = [(prompt, adapters[index % 4]) for index, prompt in enumerate(PROMPTS * 4)]
    mixed = engine.generate([prompt for prompt, _ in rows], GREEDY, adapter=[adapter for _, adapter in rows])
    assert max(seen) == 2 and engine.lora.num_slot_loads > 2
    for (prompt, adapter), output in zip(rows, mixed):
        assert output.token_ids == engine.generate([prompt], GREEDY, adapter=adapter)[0].token_ids


def test_the_prefix_cache_is_keyed_by_adapter(llama):
    """The same 40-token prompt: the base's blocks never serve the adapter's request (their K/V
    differ), the adapter's own serve its next request and the result is unchanged."""
    engine, _, adapters = llama
    prompt = [1] + list(range(50, 89))
    base = engine.generate([prompt], GREEDY)[0]
    first = engine.generate([prompt], GREEDY, adapter=adapters[0])[0]
    again = engine.generate([prompt], GREEDY, adapter=adapters[0])[0]
    other = engine.generate([prompt], GREEDY, adapter=adapters[1])[0]
    assert first.num_cached_tokens == 0 and other.num_cached_tokens == 0
    assert again.num_cached_tokens == 32 and again.token_ids == first.token_ids != base.token_ids


def test_a_bad_adapter_is_its_rows_error_and_the_others_run(llama, tmp_path):
    engine, _, adapters = llama
    outputs = engine.generate(PROMPTS[:3], GREEDY, adapter=[adapters[0], tmp_path / "missing", None])
    assert outputs[1].error.startswith(f"adapter {tmp_path / 'missing'}: no adapter_config.json")
    assert outputs[0].error is None and outputs[2].error is None and len(outputs[2].token_ids) == 8


def test_streaming_requests_carry_their_adapter(llama):
    engine, _, adapters = llama
    ids = [engine.add_request(PROMPTS[0], GREEDY, adapter=adapters[1]), engine.add_request(PROMPTS[0], GREEDY)]
    finished = {}
    while engine.has_unfinished_requests:
        finished.update((done.request_id, done.output.token_ids) for done in engine.step())
    assert finished[ids[0]] == engine.generate([PROMPTS[0]], GREEDY, adapter=adapters[1])[0].token_ids
    assert finished[ids[1]] == engine.generate([PROMPTS[0]], GREEDY)[0].token_ids != finished[ids[0]]


def test_adapters_are_refused_by_an_engine_built_without_lora(tmp_path, llama):
    engine, _, adapters = llama
    with pytest.raises(ValueError, match="adapter has 2 entries for 3 prompts"):
        engine.generate(PROMPTS, GREEDY, adapter=[None, None])
    base_only = LLMEngine.load(save_random_decoder(tmp_path / "base", "llama"), torch.float32, CPU,
                               GenerateOptions(num_blocks=16))
    with pytest.raises(ValueError, match="adapter needs an engine built with LoRA"):
        base_only.generate(PROMPTS, GREEDY, adapter=adapters[0])


@dataclass
class Row:
    adapter_key: str | None


@pytest.mark.parametrize("running, candidate, max_loras, admitted", [
    (["a", "b"], None, 2, True),           # the base is always admitted
    (["a", "b"], "a", 2, True),            # a running adapter is
    (["a", "b", None], "c", 2, False),     # a third waits
    (["a", None, None], "c", 2, True),
    ([], "a", None, True),                 # an engine without LoRA gates nothing
])
def test_the_gate_admits_at_most_max_loras_adapters(running, candidate, max_loras, admitted):
    assert admits(Row(candidate), [Row(key) for key in running], max_loras) is admitted
