"""Barge's FP8 recipe: scales chosen by a clipping search, 1x128 group scales, and which
block linears stay 16-bit (first and last blocks per stack, named layers)."""

import pytest
import torch

from engine.quant.config import DEFAULT_RECIPE, GROUP_BLOCK_SIZE, Fp8Config, fp8_config_from_name, hf_quantization_config
from engine.quant.fp8 import (FP8_DTYPE, FP8_MAX, SCALE_RATIOS, _to_fp8, block_scales_to_rows, dequantize,
                              quantize_blocks, quantize_per_channel, search_scales)
from engine.quant.recipe import describe_kept, describe_recipe, kept_16bit
from engine.quant.state import quantize_state_dict, quantized_weight_names


def _weight(rows=64, cols=300, seed=0):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, cols, generator=generator) * torch.logspace(-3, 0, rows)[:, None]
    weight[::7, 5] *= 12                                    # outliers in some rows
    return weight


def _row_errors(weight, q, scale, group_size):
    return (dequantize(q, scale, group_size) - weight).square().sum(dim=1)


def test_the_mse_search_picks_each_rows_best_candidate_by_brute_force():
    weight = _weight(rows=8)
    q, scale = quantize_per_channel(weight, "mse")
    for row in range(8):
        amax = weight[row].abs().max()
        errors = [((_to_fp8(weight[row] / (amax * r / FP8_MAX)).float() * (amax * r / FP8_MAX) - weight[row])
                   .square().sum().item(), r) for r in SCALE_RATIOS]
        best_error, best_ratio = min(errors, key=lambda pair: pair[0])    # first of equals, as the search
        assert scale[row, 0].item() == pytest.approx((amax * best_ratio / FP8_MAX).item(), rel=1e-6)
        assert _row_errors(weight[row:row + 1], q[row:row + 1], scale[row:row + 1], 300).item() == \
            pytest.approx(best_error, rel=1e-5)


def test_the_mse_search_is_never_worse_than_absmax_and_better_somewhere():
    weight = _weight()
    absmax = _row_errors(weight, *quantize_per_channel(weight, "absmax"), 300)
    searched = _row_errors(weight, *quantize_per_channel(weight, "mse"), 300)
    assert (searched <= absmax * (1 + 1e-6)).all()
    assert searched.sum() < 0.95 * absmax.sum(), (searched.sum() / absmax.sum()).item()


def test_the_mse_search_covers_block_scales_too():
    weight = _weight(rows=200, cols=260)
    for block in ((128, 128), GROUP_BLOCK_SIZE):
        (q_abs, s_abs), (q_mse, s_mse) = (quantize_blocks(weight, block, method) for method in ("absmax", "mse"))
        rows_abs, rows_mse = (block_scales_to_rows(s, 200, block[0]) for s in (s_abs, s_mse))
        assert (dequantize(q_mse, rows_mse, 128) - weight).square().sum() < \
               (dequantize(q_abs, rows_abs, 128) - weight).square().sum()


def test_group_scales_are_one_per_row_and_128_columns_and_follow_each_groups_range():
    weight = _weight(rows=10, cols=300)
    weight[:, 128:256] *= 1e5                                    # the middle group far larger
    q, scale = quantize_blocks(weight, GROUP_BLOCK_SIZE)
    assert q.dtype == FP8_DTYPE and scale.shape == (10, 3)       # 128 + 128 + 44 columns
    for group, columns in enumerate((slice(0, 128), slice(128, 256), slice(256, 300))):
        assert torch.equal(scale[:, group], weight[:, columns].abs().amax(dim=1) / FP8_MAX)
    grouped = dequantize(q, block_scales_to_rows(scale, 10, 1), 128)
    channel = dequantize(*quantize_per_channel(weight), 300)
    small = (slice(None), slice(0, 128))
    # Per channel, the small group sits 1e5 below the row's amax: in E4M3's subnormals.
    assert (grouped - weight)[small].square().sum() < 0.01 * (channel - weight)[small].square().sum()
    # Half an E4M3 step: 2^-4 of the value (3 mantissa bits), or of the subnormal spacing 2^-9 scale.
    half_step = torch.maximum(weight.abs() * 2 ** -4, block_scales_to_rows(scale, 10, 1).repeat_interleave(128, 1)[:, :300] * 2 ** -10)
    assert ((grouped - weight).abs() <= half_step * (1 + 1e-6)).all()


def test_the_recipe_keeps_the_first_and_last_block_of_each_stack():
    names = [f"model.{stack}.layers.{i}.{leaf}.weight" for stack in ("encoder", "decoder") for i in range(8)
             for leaf in ("fc1", "fc2")]
    kept = kept_16bit(names, Fp8Config(keep_edge_blocks=1))
    assert kept == {f"model.{stack}.layers.{i}.{leaf}.weight" for stack in ("encoder", "decoder") for i in (0, 7)
                    for leaf in ("fc1", "fc2")}
    assert kept_16bit(names, Fp8Config()) == set()
    assert kept_16bit(names, Fp8Config(keep_layers=("fc2",))) == {n for n in names if ".fc2." in n}
    bert = [f"encoder.layer.{i}.output.dense.weight" for i in range(16)]
    assert kept_16bit(bert, Fp8Config(keep_edge_blocks=2)) == {bert[i] for i in (0, 1, 14, 15)}


def test_a_shallow_stack_keeps_no_edge_blocks():
    # Edge blocks are kept where they are at most a quarter of the stack: 2 of 8, not 2 of 7.
    names = [f"encoder.layer.{i}.output.dense.weight" for i in range(7)]
    assert kept_16bit(names, Fp8Config(keep_edge_blocks=1)) == set()
    assert kept_16bit(names + ["encoder.layer.7.output.dense.weight"], Fp8Config(keep_edge_blocks=1)) == \
        {names[0], "encoder.layer.7.output.dense.weight"}


def test_a_shard_quantizes_by_the_whole_models_blocks():
    state = {f"model.layers.{i}.mlp.down_proj.weight": torch.randn(8, 16) for i in range(6, 8)}
    all_targets = [f"model.layers.{i}.mlp.down_proj.weight" for i in range(16)]
    quantized = quantize_state_dict(state, Fp8Config(keep_edge_blocks=1), all_targets=all_targets)
    assert sorted(quantized_weight_names(quantized)) == sorted(state)      # blocks 6, 7 are inner blocks
    shard = {f"model.layers.{i}.mlp.down_proj.weight": torch.randn(8, 16) for i in range(8, 16)}
    alone = quantize_state_dict(shard, Fp8Config(keep_edge_blocks=1))      # the shard taken as the model
    assert sorted(quantized_weight_names(alone)) == sorted(f"model.layers.{i}.mlp.down_proj.weight" for i in range(9, 15))


def test_the_named_schemes_carry_the_default_recipe_and_the_group_variant():
    for name, block in (("fp8", None), ("fp8-block", (128, 128)), ("fp8-group", (1, 128))):
        config = fp8_config_from_name(name)
        assert config.name == name and config.block_size == block
        assert (config.scale_method, config.keep_edge_blocks, config.keep_layers) == \
               (DEFAULT_RECIPE["scale_method"], DEFAULT_RECIPE["keep_edge_blocks"], DEFAULT_RECIPE["keep_layers"])
    assert describe_recipe(Fp8Config(keep_edge_blocks=1, scale_method="mse")) == \
        "fp8, mse scales, 16-bit: first and last 1 block(s)"
    with pytest.raises(ValueError, match="scale method 'max'"):
        Fp8Config(scale_method="max")


def test_kept_layers_are_named_in_the_checkpoint_and_described_by_block():
    written = hf_quantization_config(Fp8Config(), ["model.layers.0.mlp.down_proj"])
    assert written["ignore"] == ["lm_head", "model.layers.0.mlp.down_proj"]
    assert hf_quantization_config(Fp8Config((1, 128)), ["x"])["modules_to_not_convert"] == ["lm_head", "x"]
    assert describe_kept(["model.layers.0.mlp.fc", "model.layers.0.attn.qkv", "model.layers.9.attn.qkv"]) == \
        "3 linears: model.layers.0 (attn.qkv, mlp.fc); model.layers.9 (attn.qkv)"
    assert describe_kept([]) == "none"
