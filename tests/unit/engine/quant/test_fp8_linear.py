"""Fp8Linear on CPU: the dequantizing fallback, dtype moves that must not touch the FP8
weight, and the swap that puts it in place of nn.Linear."""

import torch
from torch import nn

from engine.layers.fp8_linear import Fp8Linear, fp8_weight_bytes, use_fp8_linears
from engine.quant.config import Fp8Config
from engine.quant.fp8 import FP8_DTYPE, dequantize
from engine.quant.state import quantize_state_dict
from engine.settings import quantization_of


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(200, 96)
        self.fc2 = nn.Linear(96, 200, bias=False)
        self.norm = nn.LayerNorm(200)

    def forward(self, x):
        return self.norm(self.fc2(torch.relu(self.fc1(x))))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(200, 10)


def _quantized_model(config: Fp8Config) -> tuple[Model, Model]:
    torch.manual_seed(0)
    reference = Model()
    state = quantize_state_dict(reference.state_dict(), config)
    with torch.device("meta"):
        model = Model()
    swapped = use_fp8_linears(model, state, config.block_cols)
    assert swapped == ["layers.0.fc1", "layers.0.fc2", "layers.1.fc1", "layers.1.fc2"]   # not the head
    model.load_state_dict(state, assign=True)
    return reference, model


def test_fp8_linear_computes_with_the_dequantized_weight_in_the_input_dtype():
    for config in (Fp8Config(), Fp8Config((128, 128))):
        _, model = _quantized_model(config)
        layer = model.layers[0].fc1
        assert layer.group_size == (200 if config.block_size is None else 128)
        x = torch.randn(3, 7, 200)
        expected = x @ dequantize(layer.weight, layer.weight_scale, layer.group_size).T + layer.bias
        torch.testing.assert_close(layer(x), expected)


def test_moving_to_bf16_keeps_weights_float8_and_scales_float32():
    reference, model = _quantized_model(Fp8Config())
    weight_before = model.layers[0].fc1.weight.clone()
    model = model.to(torch.bfloat16)
    layer = model.layers[0].fc1
    assert layer.weight.dtype == FP8_DTYPE and layer.weight_scale.dtype == torch.float32
    assert torch.equal(layer.weight.float(), weight_before.float())
    assert layer.bias.dtype == torch.bfloat16 and model.head.weight.dtype == torch.bfloat16
    x = torch.randn(4, 200)
    torch.testing.assert_close(model.layers[0](x.bfloat16()).float(), reference.layers[0](x), atol=0.1, rtol=0.05)


def test_weight_bytes_are_about_half_of_bf16():
    _, model = _quantized_model(Fp8Config())
    stored, bf16 = fp8_weight_bytes(model)
    assert stored == 2 * (200 * 96 + 96 * 200) + 4 * 2 * (96 + 200)
    assert bf16 == 2 * 2 * (200 * 96 + 96 * 200) and stored / bf16 < 0.52
    assert all(isinstance(m, Fp8Linear) for m in (model.layers[0].fc1, model.layers[1].fc2))


def test_quantization_of_names_the_scheme_the_layers_were_loaded_with():
    # 128x128 blocks and 1x128 groups both keep row-form scales [out, in / 128]: the name
    # comes from the load, not from the scales (fp8-group read as fp8-block before).
    for name, block_size in (("fp8", None), ("fp8-block", (128, 128)), ("fp8-group", (1, 128))):
        config = Fp8Config(block_size)
        state = quantize_state_dict(Model().state_dict(), config)
        with torch.device("meta"):
            model = Model()
        use_fp8_linears(model, state, config.block_cols, config.name)
        assert quantization_of(model) == name
    unnamed = _quantized_model(Fp8Config((1, 128)))[1]      # loaded without its scheme: read from the scales
    assert quantization_of(unnamed) == "fp8-block"
    assert quantization_of(Model()) is None
