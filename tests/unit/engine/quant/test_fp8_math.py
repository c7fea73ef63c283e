"""FP8 quantize/dequantize math: scale conventions, block shapes and padding, and the
configs read from checkpoints. Pure tensors, no model."""

import pytest
import torch

from engine.quant.checkpoint import from_checkpoint, to_checkpoint
from engine.quant.config import Fp8Config, fp8_config_from_hf, fp8_config_from_name, hf_quantization_config
from engine.quant.fp8 import (FP8_DTYPE, FP8_MAX, block_scales_to_rows, dequantize, quantize_activations,
                              quantize_blocks, quantize_per_channel)
from engine.quant.state import is_block_linear_weight, quantize_state_dict

# E4M3 keeps 3 mantissa bits: round-to-nearest is off by at most 2**-4 of the value's
# power of two, so |w - dq| <= amax / 448 * 2**-4 * 2**8 never binds; relative 1/16 does.
E4M3_RELATIVE_STEP = 2 ** -4


def _weight(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    # Rows of very different magnitudes: one global scale would flush the small rows to zero.
    return torch.randn(rows, cols, generator=generator) * torch.logspace(-3, 1, rows)[:, None]


def test_per_channel_scale_is_the_dequantizing_multiplier_of_each_row():
    weight = _weight(48, 80)
    q, scale = quantize_per_channel(weight)
    assert q.dtype == FP8_DTYPE and scale.shape == (48, 1) and scale.dtype == torch.float32
    torch.testing.assert_close(scale[:, 0], weight.abs().amax(dim=1) / FP8_MAX)
    assert q.float().abs().amax(dim=1).eq(FP8_MAX).all()          # each row's largest value maps to 448
    restored = q.float() * scale
    assert ((restored - weight).abs() <= weight.abs() * E4M3_RELATIVE_STEP + scale * 2 ** -9).all()


@pytest.mark.parametrize("shape", [(256, 384), (200, 300), (1, 7), (130, 129)])
def test_block_scales_cover_ceil_blocks_and_edge_blocks_are_padded_not_stretched(shape):
    weight = _weight(*shape)
    q, scale = quantize_blocks(weight, (128, 128))
    rows, cols = shape
    assert q.shape == shape and scale.shape == (-(-rows // 128), -(-cols // 128))
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            block = weight[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            assert scale[i, j] == pytest.approx(block.abs().max().item() / FP8_MAX, rel=1e-6)
    # HF's weight_scale_inv convention: weight ≈ q * scale, block by block.
    full = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
    assert ((q.float() * full - weight).abs() <= weight.abs() * E4M3_RELATIVE_STEP + full * 2 ** -9).all()


def test_row_form_of_block_scales_dequantizes_to_the_same_weights():
    weight = _weight(200, 300)
    q, block_scale = quantize_blocks(weight, (128, 128))
    rows_scale = block_scales_to_rows(block_scale, 200, 128)
    assert rows_scale.shape == (200, 3)
    expected = q.float() * block_scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:200, :300]
    assert torch.equal(dequantize(q, rows_scale, 128), expected)
    with pytest.raises(ValueError, match="does not fit 300 rows"):
        block_scales_to_rows(block_scale, 300, 128)


def test_zero_rows_stay_zero_and_huge_values_saturate_instead_of_nan():
    weight = torch.zeros(4, 16)
    weight[1, 3] = 1e30
    q, scale = quantize_per_channel(weight)
    assert torch.isfinite(q.float()).all() and torch.isfinite(scale).all()
    assert q[0].float().eq(0).all() and q[1, 3].float() == FP8_MAX


def test_activation_scales_are_per_token_or_per_token_and_group():
    x = torch.randn(5, 200) * torch.tensor([1e-2, 1, 10, 100, 1e3])[:, None]
    q, scale = quantize_activations(x)
    assert scale.shape == (5, 1)
    torch.testing.assert_close(q.float() * scale, x, rtol=E4M3_RELATIVE_STEP, atol=1e-6)
    q, scale = quantize_activations(x, group_size=128)
    assert scale.shape == (5, 2)
    torch.testing.assert_close(scale[:, 1], x[:, 128:].abs().amax(dim=1) / FP8_MAX)


def test_bad_weights_and_block_sizes_raise_value_errors_naming_them():
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        quantize_per_channel(torch.ones(3))
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        quantize_per_channel(torch.ones(3, 3).to(FP8_DTYPE))
    with pytest.raises(ValueError, match=r"\(128, 0\)"):
        quantize_blocks(torch.ones(3, 3), (128, 0))
    with pytest.raises(ValueError, match="'int4'"):
        fp8_config_from_name("int4")


def test_only_linear_weights_inside_numbered_blocks_are_targets():
    def target(name, shape=(8, 8)):
        return is_block_linear_weight(name, torch.zeros(shape))
    assert target("model.layers.3.mlp.down_proj.weight")
    assert target("encoder.layer.0.attention.self.query.weight")        # BERT
    assert target("model.encoder.layers.1.fc1.weight")                  # Whisper
    assert not target("model.embed_tokens.weight") and not target("lm_head.weight")
    assert not target("model.layers.0.input_layernorm.weight", (8,))
    assert not target("model.layers.0.self_attn.q_proj.bias", (8,))


def test_configs_from_both_checkpoint_formats():
    qwen3_fp8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                 "weight_block_size": [128, 128]}
    assert fp8_config_from_hf(qwen3_fp8) == Fp8Config((128, 128), "fp8")
    assert fp8_config_from_hf({"quant_method": "fp8", "activation_scheme": "static"}).block_size is None
    written = hf_quantization_config(Fp8Config())
    assert written["quant_method"] == "compressed-tensors"
    assert written["config_groups"]["group_0"]["weights"]["strategy"] == "channel"
    assert written["config_groups"]["group_0"]["input_activations"] == {
        "num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True,
        "group_size": None, "block_structure": None}
    assert fp8_config_from_hf(written) == Fp8Config(None, "compressed-tensors")
    int4 = {"quant_method": "compressed-tensors", "config_groups": {
        "group_0": {"format": "pack-quantized", "weights": {"num_bits": 4, "type": "int", "strategy": "group"}}}}
    with pytest.raises(ValueError, match="'pack-quantized'"):
        fp8_config_from_hf(int4)
    with pytest.raises(ValueError, match="'gptq'"):
        fp8_config_from_hf({"quant_method": "gptq"})


@pytest.mark.parametrize("config", [Fp8Config(), Fp8Config((128, 128))])
def test_disk_form_round_trips_to_the_same_in_memory_state(config):
    state = {"model.layers.0.mlp.up_proj.weight": _weight(200, 300), "model.norm.weight": torch.ones(300)}
    in_memory = quantize_state_dict(state, config)
    on_disk = to_checkpoint(in_memory, config)
    if config.block_size:
        assert on_disk["model.layers.0.mlp.up_proj.weight_scale_inv"].shape == (2, 3)
    else:
        assert on_disk["model.layers.0.mlp.up_proj.weight_scale"].shape == (200, 1)
    back = from_checkpoint(on_disk, config)
    assert back.keys() == in_memory.keys()
    assert all(torch.equal(back[name].float(), in_memory[name].float()) for name in back)


def test_per_tensor_checkpoint_scales_broadcast_to_every_row_and_static_input_scales_are_dropped():
    q = torch.randn(4, 8).to(FP8_DTYPE)
    state = {"layers.0.fc.weight": q, "layers.0.fc.weight_scale": torch.tensor(0.5),
             "layers.0.fc.input_scale": torch.tensor(0.1)}
    back = from_checkpoint(state, Fp8Config(None, "fp8"))
    assert set(back) == {"layers.0.fc.weight", "layers.0.fc.weight_scale"}
    assert torch.equal(back["layers.0.fc.weight_scale"], torch.full((4, 1), 0.5))
    with pytest.raises(ValueError, match="has no scale"):
        from_checkpoint({"layers.0.fc.weight": q}, Fp8Config(None, "fp8"))
