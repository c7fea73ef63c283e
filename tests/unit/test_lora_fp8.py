"""LoRA adapters over FP8 base weights (issue 44: "FP8 base weights with 16-bit adapters"):
the adapter's delta is added to the FP8 linear's output as to any base linear's
(engine/lora/linear.py). On CPU an Fp8Linear multiplies by its dequantized weight, so the
reference is PEFT on a transformers model whose block linears hold those same weights
(quantized per channel, then dequantized): greedy tokens must be equal, a mixed batch of
adapters and the base equal to each run alone, and the adapters must change the text."""

import pytest
import torch
from torch import nn

from engine.generate.llm_engine import LLMEngine
from engine.generate.options import GenerateOptions
from engine.generate.sampling_params import SamplingParams
from engine.layers.fp8_linear import Fp8Linear
from engine.lora.linear import LoraLinear
from engine.lora.options import LoraOptions
from engine.quant.fp8 import dequantize, quantize_per_channel
from tests.support.lora_adapters import ATTENTION, MLP, peft_greedy_tokens, save_random_adapter
from tests.support.random_decoders import save_random_decoder

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

CPU = torch.device("cpu")
PROMPTS = [[1, 5, 9, 33, 100, 7], [1, 42, 43, 44], [1, 300, 301, 302, 8, 9, 10, 11, 12]]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
SHAPES = [(8, ATTENTION + MLP), (16, MLP), (4, ATTENTION)]


def _dequantized_reference(folder):
    """The transformers model with every decoder-block linear's weight as the FP8 engine holds
    it: quantized per output channel, then multiplied back out in float32."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear) and ".layers." in f".{name}":
                q, scale = quantize_per_channel(module.weight)
                module.weight.copy_(dequantize(q, scale, module.in_features, torch.float32))
    return model


def test_adapters_over_fp8_base_weights_give_peft_tokens_on_the_same_weights(tmp_path):
    folder = save_random_decoder(tmp_path / "llama", "llama")
    engine = LLMEngine.load(folder, torch.float32, CPU, GenerateOptions(num_blocks=64, max_num_seqs=16),
                            quantization="fp8", lora=LoraOptions(max_loras=4, max_lora_rank=16))
    wrapped = [module.base for module in engine.runner.model.modules() if isinstance(module, LoraLinear)]
    assert wrapped and all(isinstance(base, Fp8Linear) and base.is_per_channel for base in wrapped)
    reference = _dequantized_reference(folder)
    adapters = [save_random_adapter(reference, tmp_path / f"adapter-{index}", rank, targets, seed=index, scale=0.3)
                for index, (rank, targets) in enumerate(SHAPES)]

    rows = [(prompt, adapter) for prompt in PROMPTS for adapter in [*adapters, None]]
    mixed = engine.generate([prompt for prompt, _ in rows], GREEDY, adapter=[adapter for _, adapter in rows])
    base = {tuple(prompt): output.token_ids for (prompt, adapter), output in zip(rows, mixed) if adapter is None}
    changed = 0
    for (prompt, adapter), output in zip(rows, mixed):
        alone = engine.generate([prompt], GREEDY, adapter=adapter)[0].token_ids
        assert output.token_ids == alone, (prompt, adapter)
        if adapter is not None:
            assert output.token_ids == peft_greedy_tokens(reference, adapter, prompt, GREEDY.max_tokens), (prompt, adapter.name)
            changed += output.token_ids != base[tuple(prompt)]
    assert changed >= len(PROMPTS) * len(adapters) // 2, "the adapters hardly change the text: the test could not fail"
