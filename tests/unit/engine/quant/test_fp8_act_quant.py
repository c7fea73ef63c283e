"""The one-kernel FP8 activation quantizers against the PyTorch reference
(engine/quant/fp8.py's quantize_activations): the same E4M3 bytes and the same scales, on
whatever device the run has (CUDA tensors on a GPU, Triton's interpreter on CPU)."""

import os

import pytest
import torch

pytest.importorskip("triton")

from engine.quant.fp8 import FP8_MAX, MIN_SCALE, quantize_activations  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (tokens, features): one token (decode), odd widths that are not block multiples, SmolLM2's FFN.
SHAPES = [(1, 64), (5, 200), (17, 576), (3, 1536)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def kernels():
    if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and TRITON_INTERPRET is not 1")
    from engine.kernels import fp8_act_quant
    return fp8_act_quant


def _activations(shape, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator) * torch.logspace(-2, 1, shape[0])[:, None]   # rows of varied range
    x[:, 0] *= 20                                                                               # an outlier column
    return x.to(DEVICE, dtype)


def _assert_same_quantization(ours, expected):
    (q, scale), (q_ref, scale_ref) = ours, expected
    assert q.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
    assert q.shape == q_ref.shape and scale.shape == scale_ref.shape
    assert torch.equal(scale, scale_ref.to(scale.device))
    assert torch.equal(q.view(torch.uint8), q_ref.to(q.device).view(torch.uint8))      # bit for bit


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_per_token_kernel_writes_the_references_e4m3_bytes_and_scales(kernels, shape, dtype):
    x = _activations(shape, dtype)
    _assert_same_quantization(kernels.quantize_per_token(x), quantize_activations(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_per_group_kernel_writes_the_references_e4m3_bytes_and_scales(kernels, shape, dtype):
    x = _activations(shape, dtype, seed=1)
    ours = kernels.quantize_per_group(x, 128)
    assert ours[1].shape == (shape[0], -(-shape[1] // 128))         # the last group may be narrower
    _assert_same_quantization(ours, quantize_activations(x, 128))


def test_zero_rows_get_the_floor_scale_and_zeros_and_the_largest_value_maps_to_448(kernels):
    x = _activations((4, 256), torch.float32)
    x[1] = 0
    x[2, :128] = 0                                                  # one zero group, one not
    for q, scale in (kernels.quantize_per_token(x), kernels.quantize_per_group(x, 128)):
        assert scale[1].eq(MIN_SCALE).all() and q[1].float().eq(0).all()
        assert q.float().abs().amax(dim=1)[[0, 2, 3]].eq(FP8_MAX).all()
    _, group_scale = kernels.quantize_per_group(x, 128)
    assert group_scale[2, 0] == MIN_SCALE and group_scale[2, 1] > MIN_SCALE


def test_a_strided_view_quantizes_like_its_contiguous_copy(kernels):
    x = _activations((6, 384), torch.bfloat16)[:, :256]          # row stride 384: a slice of a fused output
    _assert_same_quantization(kernels.quantize_per_token(x), quantize_activations(x.contiguous()))


def test_no_tokens_gives_empty_results_and_bad_shapes_are_refused(kernels):
    q, scale = kernels.quantize_per_token(torch.empty(0, 64, device=DEVICE))
    assert q.shape == (0, 64) and scale.shape == (0, 1)
    with pytest.raises(ValueError, match="tokens, features"):
        kernels.quantize_per_token(torch.zeros(2, 3, 64, device=DEVICE))
    with pytest.raises(ValueError, match="group_size"):
        kernels.quantize_per_group(torch.zeros(2, 64, device=DEVICE), 0)


def test_fp8_linear_w8a8_block_path_quantizes_activations_with_the_group_kernel(kernels, monkeypatch):
    # The W8A8 route of Fp8Linear for block weights (a GPU of capability >= 8.9), taken here on
    # whatever device the run has: activations through quantize_per_group, then the group GEMM.
    from engine.kernels import fp8_matmul
    from engine.layers import fp8_linear
    from engine.quant.fp8 import block_scales_to_rows, quantize_blocks

    weight = torch.randn(96, 256, generator=torch.Generator().manual_seed(3))
    q, block_scale = quantize_blocks(weight)
    layer = fp8_linear.Fp8Linear(256, 96, bias=True, num_groups=2, group_size=128)
    layer.weight, layer.weight_scale = q.to(DEVICE), block_scales_to_rows(block_scale, 96, 128).to(DEVICE)
    layer.bias = torch.nn.Parameter(torch.randn(96, device=DEVICE))
    monkeypatch.setattr(fp8_linear, "fp8_backend", lambda device: "w8a8")
    calls = []
    monkeypatch.setattr(kernels, "quantize_per_group", lambda x, g: calls.append(g) or
                        kernels._quantize(x, g))
    x = _activations((5, 256), torch.float32)
    ours = layer(x)
    x_q, x_scale = quantize_activations(x, 128)
    # The eager quantizer's bytes through the same GEMM: equal, since the kernel's bytes are its.
    expected = fp8_matmul.fp8_w8a8_group_matmul(x_q, x_scale, layer.weight, layer.weight_scale, 128,
                                                torch.float32) + layer.bias
    assert calls == [128]
    assert torch.equal(ours, expected)
