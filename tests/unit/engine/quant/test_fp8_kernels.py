"""The Triton FP8 GEMMs against an fp32 reference, run by Triton's interpreter on CPU
(TRITON_INTERPRET=1) or on the GPU when there is one, on small shapes, edges that are not
tile multiples included.

NOTE: the tolerances follow from the formats, per output element, in terms of
A = sum_k |x_k| |w_k| (the fp32 product of the absolute values), the scale a rounding
error in a dot product is proportional to (Higham's bound: n additions each rounding
with unit roundoff u cost at most n u A):

    weight-only   u_in A      the kernel rounds each dequantized weight to x's dtype before
                              the dot (bf16 u = 2^-9, fp16 2^-11, fp32: no rounding)
                + u_out |y|   the output's own rounding to its dtype
                + 2 K 2^-24 A fp32 accumulation, the kernel's and the reference's
    w8a8 group    G u_acc A   each group's FP8 dot (G = 128 products, each exact in fp32);
                              u_acc = 2^-24 where the dot accumulates in fp32 (interpreter),
                              2^-13 on a GPU: Hopper's FP8 tensor cores keep about 14 bits
                              of the running sum (DeepSeek-V3 report, 3.3.2), which is why
                              44 % of a 33x130x256 product was off by up to 0.015 (A ~ 160)
                + 2 K 2^-24 A + 2^-24 |y|   fp32 sums across groups, the output's rounding
"""

import os

import pytest
import torch

pytest.importorskip("triton")

from engine.quant.fp8 import (block_scales_to_rows, dequantize, expand_scale, quantize_activations,  # noqa: E402
                              quantize_blocks, quantize_per_channel)

FP32_U = 2.0 ** -24         # fp32 unit roundoff
FP8_DOT_U = 2.0 ** -13      # a GPU FP8 dot's running sum: about 14 bits kept (see the module doc)

SHAPES = [(1, 64, 128), (5, 70, 200), (33, 130, 256)]        # (tokens, out, in)


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def kernels():
    # tests/conftest.py turns the interpreter on before triton is imported, on CPU machines.
    if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and TRITON_INTERPRET is not 1")
    from engine.kernels import fp8_matmul
    return fp8_matmul


def _quantized(out_features, in_features, block):
    weight = torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(out_features))
    if block is None:
        q, scale = quantize_per_channel(weight)
        return q.to(DEVICE), scale.to(DEVICE), in_features
    q, block_scale = quantize_blocks(weight, block)
    return q.to(DEVICE), block_scales_to_rows(block_scale, out_features, block[0]).to(DEVICE), block[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block", [None, (128, 128)])
@pytest.mark.parametrize("shape", SHAPES)
def test_weight_only_kernel_matches_its_reference(kernels, shape, block, dtype):
    num_tokens, out_features, in_features = shape
    q, scale, group_size = _quantized(out_features, in_features, block)
    x = torch.randn(num_tokens, in_features).to(DEVICE, dtype)
    bias = torch.randn(out_features).to(DEVICE, dtype)
    ours = kernels.fp8_weight_only_matmul(x, q, scale, group_size, bias)
    assert ours.dtype == dtype and ours.shape == (num_tokens, out_features)
    weight = dequantize(q, scale, group_size)                          # fp32, exactly what the kernel loads
    expected = x.float() @ weight.T + bias.float()
    sum_abs = x.float().abs() @ weight.abs().T
    unit = 0.0 if dtype == torch.float32 else _unit_roundoff(dtype)
    bound = unit * sum_abs + _unit_roundoff(dtype) * expected.abs() + 2 * in_features * FP32_U * sum_abs
    _assert_within(ours.float(), expected, bound)


@pytest.mark.parametrize("shape", SHAPES)
def test_w8a8_group_kernel_matches_its_reference(kernels, shape):
    num_tokens, out_features, in_features = shape
    q, scale, group_size = _quantized(out_features, in_features, (128, 128))
    x_q, x_scale = quantize_activations(torch.randn(num_tokens, in_features, device=DEVICE), group_size)
    ours = kernels.fp8_w8a8_group_matmul(x_q, x_scale, q, scale, group_size, torch.float32)
    expected = kernels.reference_w8a8(x_q, x_scale, q, scale, group_size, torch.float32)       # fp32
    x_abs = (x_q.float() * expand_scale(x_scale, in_features, group_size)).abs()
    sum_abs = x_abs @ dequantize(q, scale, group_size).abs().T
    accumulation = FP8_DOT_U if DEVICE == "cuda" else FP32_U
    bound = (group_size * accumulation + 2 * in_features * FP32_U) * sum_abs + FP32_U * expected.abs()
    _assert_within(ours, expected, bound)


def _unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


def _assert_within(ours: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> None:
    excess = (ours - expected).abs() - bound
    worst = int(excess.argmax())
    assert excess.max() <= 0, (f"{int((excess > 0).sum())} elements past their bound; worst "
                               f"{ours.flatten()[worst].item()} vs {expected.flatten()[worst].item()}, "
                               f"bound {bound.flatten()[worst].item():.3g}")


def test_w8a8_group_kernel_refuses_a_group_tl_dot_cannot_tile(kernels):
    q, scale, _ = _quantized(64, 96, None)
    x_q, x_scale = quantize_activations(torch.randn(2, 96, device=DEVICE), 96)
    with pytest.raises(ValueError, match="got 96"):
        kernels.fp8_w8a8_group_matmul(x_q, x_scale, q, scale, 96, torch.float32)
