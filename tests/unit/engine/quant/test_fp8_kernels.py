"""The Triton FP8 GEMMs against their PyTorch references, run by Triton's interpreter on
CPU (TRITON_INTERPRET=1) on small shapes, edges that are not tile multiples included."""

import os

import pytest
import torch

pytest.importorskip("triton")

from engine.quant.fp8 import block_scales_to_rows, quantize_activations, quantize_blocks, quantize_per_channel  # noqa: E402

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
    expected = kernels.reference_weight_only(x, q, scale, group_size, bias)
    assert ours.dtype == dtype and ours.shape == (num_tokens, out_features)
    # fp32: summation order only. 16-bit: the output's own rounding (one ulp) plus the
    # kernel rounding each dequantized tile to 16 bits before its dot.
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(ours.float(), expected.float(), rtol=tolerance, atol=tolerance * 4)


@pytest.mark.parametrize("shape", SHAPES)
def test_w8a8_group_kernel_matches_its_reference(kernels, shape):
    num_tokens, out_features, in_features = shape
    q, scale, group_size = _quantized(out_features, in_features, (128, 128))
    x_q, x_scale = quantize_activations(torch.randn(num_tokens, in_features, device=DEVICE), group_size)
    ours = kernels.fp8_w8a8_group_matmul(x_q, x_scale, q, scale, group_size, torch.float32)
    expected = kernels.reference_w8a8(x_q, x_scale, q, scale, group_size, torch.float32)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)


def test_w8a8_group_kernel_refuses_a_group_tl_dot_cannot_tile(kernels):
    q, scale, _ = _quantized(64, 96, None)
    x_q, x_scale = quantize_activations(torch.randn(2, 96, device=DEVICE), 96)
    with pytest.raises(ValueError, match="got 96"):
        kernels.fp8_w8a8_group_matmul(x_q, x_scale, q, scale, 96, torch.float32)
