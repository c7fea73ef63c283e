"""PackedLinear (oneDNN weights reordered once at load) computes what nn.Linear does,
and pack_linears swaps only plain fp32 linears on the CPU."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.cpu_memory import keep_freed_memory
from engine.layers.linear import linear_act, linear_residual
from engine.layers.packed_linear import HAS_ONEDNN_PACKING, PackedLinear, pack_linears
from tests.support.linear_paths import LINEAR_PATHS, bf16_linears, linear_path

pytestmark = pytest.mark.skipif(not HAS_ONEDNN_PACKING, reason="this PyTorch build has no oneDNN weight packing")


@pytest.mark.parametrize("rows", [1, 7, 128, 300])
def test_packed_linear_matches_nn_linear(rows):
    torch.manual_seed(0)
    linear = nn.Linear(96, 160)
    x = torch.randn(rows, 96)
    expected = linear(x)
    packed = PackedLinear(linear, batch_hint=32)
    assert torch.allclose(packed(x), expected, atol=1e-5, rtol=1e-5)
    assert torch.allclose(packed(x.view(1, rows, 96)), expected.view(1, rows, 160), atol=1e-5, rtol=1e-5)


@pytest.fixture(params=LINEAR_PATHS)
def cpu_path(request):
    with linear_path(request.param) as path:
        yield path


@pytest.mark.parametrize("act, reference", [
    ("gelu", F.gelu),
    ("gelu_new", lambda y: F.gelu(y, approximate="tanh")),
    ("relu", F.relu),
])
def test_fused_epilogues_match_the_unfused_math(act, reference, cpu_path):
    """With autograd (unfused) and in inference, packed and plain: on the oneDNN path ReLU
    and GELU are post-ops; on the MKL path GELU runs in place after the matmul."""
    torch.manual_seed(0)
    linear = nn.Linear(64, 64)
    x = torch.randn(9, 64)
    packed = PackedLinear(linear, batch_hint=16)
    with torch.no_grad():
        expected = reference(linear(x))
    assert torch.allclose(linear_act(x, packed, act), expected, atol=1e-5)
    with torch.inference_mode():
        assert torch.allclose(linear_act(x, packed, act), expected, atol=1e-5)
        assert torch.allclose(linear_act(x, linear, act), expected, atol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_residual_add_matches_the_unfused_math(bias, cpu_path):
    """oneDNN's add post-op (packed, and plain on the oneDNN path) or MKL's matmul
    accumulating into residual + bias (plain on the MKL path); the residual is not written."""
    torch.manual_seed(0)
    linear = nn.Linear(48, 32, bias=bias)
    x, residual = torch.randn(11, 48), torch.randn(11, 32)
    before = residual.clone()
    with torch.no_grad():
        expected = residual + linear(x)
    with torch.inference_mode():
        for layer in (linear, PackedLinear(linear, batch_hint=16)):
            assert torch.allclose(linear_residual(x, layer, residual), expected, atol=1e-5)
    assert torch.equal(residual, before)
    assert torch.allclose(linear_residual(x, linear, residual), expected, atol=1e-5)   # with autograd


def test_pack_linears_swaps_plain_fp32_linears_only():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4, bias=False))
            self.norm = nn.LayerNorm(4)

    block = Block()
    x = torch.randn(3, 8)
    expected = block.norm(block.inner(x))
    assert pack_linears(block, batch_hint=4) == 2
    assert [type(m).__name__ for m in block.inner] == ["PackedLinear", "ReLU", "PackedLinear"]
    assert torch.allclose(block.norm(block.inner(x)), expected, atol=1e-6)
    assert pack_linears(nn.Sequential(nn.Linear(4, 4).to(torch.bfloat16)), batch_hint=4) == 0


def test_the_allocator_keeps_freed_memory_on_glibc():
    assert keep_freed_memory() is True   # this machine runs glibc; the call is idempotent
    assert keep_freed_memory() is True



@bf16_linears
@pytest.mark.parametrize("rows", [1, 33, 300])
def test_a_packed_bf16_linear_and_its_epilogues_match_fp32_math(rows):
    """The embedder's AMX path: bf16 in, fp32 accumulation, bf16 out, GELU and the residual
    add as post-ops; within bf16's rounding of the fp32 results."""
    torch.manual_seed(0)
    linear = nn.Linear(96, 160)
    x, residual = torch.randn(rows, 96), torch.randn(rows, 160)
    with torch.no_grad():
        expected = {"plain": linear(x), "gelu": F.gelu(linear(x)), "add": residual + linear(x)}
    packed = PackedLinear(copy.deepcopy(linear).to(torch.bfloat16), batch_hint=64)
    xb = x.to(torch.bfloat16)
    with torch.inference_mode():
        ours = {"plain": packed(xb), "gelu": linear_act(xb, packed, "gelu"),
                "add": linear_residual(xb, packed, residual.to(torch.bfloat16))}
    for name, value in ours.items():
        assert value.dtype == torch.bfloat16
        assert torch.allclose(value.float(), expected[name], atol=0.05, rtol=0.02), name


@bf16_linears
def test_pack_linears_packs_bf16_only_when_asked():
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4)).to(torch.bfloat16)
    assert pack_linears(model, batch_hint=4) == 0             # decoders and Whisper: fp32 only
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    with torch.no_grad():
        expected = model(x)
    assert pack_linears(model, batch_hint=4, dtypes=(torch.float32, torch.bfloat16)) == 2
    assert [type(m).__name__ for m in model] == ["PackedLinear", "PackedLinear"]
    with torch.no_grad():
        assert torch.allclose(model(x).float(), expected.float(), atol=0.03)
