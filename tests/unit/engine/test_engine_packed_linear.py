"""PackedLinear (oneDNN weights reordered once at load) computes what nn.Linear does,
and pack_linears swaps only plain fp32 linears on the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.cpu_memory import keep_freed_memory
from engine.layers import linear as linear_module
from engine.layers.linear import fusion_tables, linear_act, linear_residual
from engine.layers.packed_linear import HAS_ONEDNN_PACKING, PackedLinear, pack_linears

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


@pytest.fixture(params=["gelu_post_op", "gelu_in_place"])
def gelu_path(request, monkeypatch):
    """Both ways GELU runs in inference, whichever this CPU takes: oneDNN's post-op
    (AVX-512) or torch's in-place GELU after the matmul (AVX2)."""
    fused, in_place = fusion_tables(fuse_gelu=request.param == "gelu_post_op")
    monkeypatch.setattr(linear_module, "ONEDNN_ACTIVATIONS", fused)
    monkeypatch.setattr(linear_module, "IN_PLACE_GELU", in_place)
    return request.param


@pytest.mark.parametrize("act, reference", [
    ("gelu", F.gelu),
    ("gelu_new", lambda y: F.gelu(y, approximate="tanh")),
    ("relu", F.relu),
])
def test_fused_epilogues_take_a_packed_linear(act, reference, gelu_path):
    """With autograd (unfused) and in inference (ReLU fused by oneDNN, GELU fused or in place after it)."""
    torch.manual_seed(0)
    linear = nn.Linear(64, 64)
    x, residual = torch.randn(9, 64), torch.randn(9, 64)
    packed = PackedLinear(linear, batch_hint=16)
    with torch.no_grad():
        expected = reference(linear(x))
    assert torch.allclose(linear_act(x, packed, act), expected, atol=1e-5)
    with torch.inference_mode():
        assert torch.allclose(linear_act(x, packed, act), expected, atol=1e-5)
        assert torch.allclose(linear_act(x, linear, act), expected, atol=1e-5)
        assert torch.allclose(linear_residual(x, packed, residual), residual + linear(x), atol=1e-5)


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
