"""Linear layers with their epilogue fused: bias + activation, bias + residual add.

On CPU, oneDNN's linear primitive applies the epilogue while the output tile is still
in cache, saving a pass over [num_tokens, width] per fusion. Whether GELU fuses depends
on the CPU. With AVX-512, oneDNN's GELU post-op is the cheaper (measured on a 2-core
AVX-512 Xeon, [2048, 384] x [384, 1536] fp32: matmul 7.6 ms, with the GELU post-op
8.4 ms, with torch's gelu_ after it 11.7 ms, 25.8 ms for the tanh form). On an AVX2-only
CPU it is the dearer (2-core AVX2 EPYC, same shapes: 22.2 ms fused, 17.1 ms for the
matmul alone, 1.6 ms for torch's gelu_ over its output), so there GELU runs in place
after the matmul. Elsewhere, or where this PyTorch build lacks the op, the same math
runs unfused.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.packed_linear import PackedLinear

# hidden_act -> GELU's `approximate` (oneDNN's post-op takes the same names).
GELU_APPROXIMATE = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}


def _onednn_gelu_pays() -> bool:
    """oneDNN's GELU post-op beats a separate GELU pass with AVX-512, not with AVX2 alone."""
    try:
        return torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    except (AttributeError, RuntimeError):
        return False


def fusion_tables(fuse_gelu: bool) -> tuple[dict, dict]:
    """(hidden_act -> (oneDNN post-op, its algorithm), hidden_act -> the `approximate` of a
    GELU that runs in place after the matmul): what the fused path does with each activation."""
    fused = {"relu": ("relu", None)}
    if fuse_gelu:
        fused.update({act: ("gelu", approximate) for act, approximate in GELU_APPROXIMATE.items()})
    return fused, {act: approximate for act, approximate in GELU_APPROXIMATE.items() if act not in fused}


# The unfused twins of both are in ACTIVATIONS.
ONEDNN_ACTIVATIONS, IN_PLACE_GELU = fusion_tables(_onednn_gelu_pays())
ACTIVATIONS = {
    **{act: functools.partial(F.gelu, approximate=approximate) for act, approximate in GELU_APPROXIMATE.items()},
    "relu": F.relu,
}


def _fused_dtypes() -> tuple[torch.dtype, ...]:
    """oneDNN's fused bf16 linears need avx512bw/vl/dq or avx_ne_convert; on a CPU
    without them (AVX2 only) it raises, so bf16 takes the unfused path there."""
    try:
        bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        bf16 = False
    return (torch.float32, torch.bfloat16) if bf16 else (torch.float32,)


FUSED_DTYPES = _fused_dtypes()


def _has_onednn_linear() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


HAS_ONEDNN_LINEAR = _has_onednn_linear()


def _can_fuse(x: torch.Tensor) -> bool:
    return HAS_ONEDNN_LINEAR and x.device.type == "cpu" and x.dtype in FUSED_DTYPES and x.dim() == 2


def _is_plain(linear: nn.Module) -> bool:
    """An nn.Linear, or one whose weight oneDNN packed (engine.layers.packed_linear):
    their weight goes to oneDNN as it is. Not an Fp8Linear."""
    return type(linear) in (nn.Linear, PackedLinear)


def linear_act(x: torch.Tensor, linear: nn.Module, act: str) -> torch.Tensor:
    """act(linear(x)); x: [num_tokens, in] -> [num_tokens, out]. Only a plain (or packed)
    linear fuses; another layer (Fp8Linear) runs its own matmul, then the activation."""
    if _is_plain(linear) and _can_fuse(x) and act in ONEDNN_ACTIVATIONS:
        attr, algorithm = ONEDNN_ACTIVATIONS[act]
        return torch.ops.mkldnn._linear_pointwise(x, linear.weight, linear.bias, attr, [], algorithm)
    if act in IN_PLACE_GELU and not torch.is_grad_enabled():
        return torch.ops.aten.gelu_(linear(x), approximate=IN_PLACE_GELU[act])
    return ACTIVATIONS[act](linear(x))


def linear_residual(x: torch.Tensor, linear: nn.Module, residual: torch.Tensor) -> torch.Tensor:
    """residual + linear(x); x: [num_tokens, in], residual: [num_tokens, out]."""
    if (_is_plain(linear) and _can_fuse(x) and residual.is_contiguous()
            and residual.dtype == x.dtype):
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual, linear.weight, linear.bias, "add")
    return residual + linear(x)
