"""Linear layers with their epilogue fused: bias + activation, bias + residual add.

On CPU there are two fp32 matmuls to choose from, and which is faster depends on the CPU.
oneDNN's linear primitive takes a weight reordered once at load (PackedLinear) and applies
the epilogue while the output tile is still in cache; MKL's sgemm (torch's F.linear and
addmm) takes the plain weight and accumulates into whatever its output already holds.
With AVX-512 oneDNN is the one to take, GELU included (measured on a 2-core AVX-512 Xeon,
[2048, 384] x [384, 1536] fp32: matmul 7.6 ms, with the GELU post-op 8.4 ms, with torch's
gelu_ after it 11.7 ms, 25.8 ms for the tanh form). With AVX2 alone MKL is (2-core AVX2
EPYC, 1,939 rows, MiniLM's four shapes, GFLOP/s: MKL 174-184 against 160-165 for the
packed oneDNN weight; with the residual add 141-167 for MKL accumulating into residual +
bias against 116-135 for oneDNN's binary post-op; the GELU post-op 22.2 ms against 17.1 ms
for the matmul alone and 1.6 ms for torch's gelu_ after it). So on an AVX2-only CPU an
encoder keeps plain nn.Linear layers (ONEDNN_PAYS is False, the embedder packs nothing),
GELU runs in place after the matmul and the residual add is the matmul's own accumulator.
In the whole model the gain is smaller, as MKL re-blocks each weight on every call and
the weights no longer sit in cache: MiniLM over 1,000 sentences, +2.2 % with the batches
timed one by one against the oneDNN path. Small row counts are another matter: decode
steps always pack (engine/layers/packed_linear.py).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.packed_linear import PackedLinear

# hidden_act -> GELU's `approximate` (oneDNN's post-op takes the same names).
GELU_APPROXIMATE = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}


def _onednn_pays() -> bool:
    """oneDNN's fp32 linears (packed weights, GELU and add post-ops) beat MKL's sgemm at an
    encoder's row counts with AVX-512, not with AVX2 alone."""
    try:
        return torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    except (AttributeError, RuntimeError):
        return False


@functools.cache
def fusion_tables(fuse_gelu: bool) -> tuple[dict, dict]:
    """(hidden_act -> (oneDNN post-op, its algorithm), hidden_act -> the `approximate` of a
    GELU that runs in place after the matmul): what the fused path does with each activation."""
    fused = {"relu": ("relu", None)}
    if fuse_gelu:
        fused.update({act: ("gelu", approximate) for act, approximate in GELU_APPROXIMATE.items()})
    return fused, {act: approximate for act, approximate in GELU_APPROXIMATE.items() if act not in fused}


# The one switch: the fusion tables (fusion_tables(ONEDNN_PAYS)), which linears go to
# oneDNN (_is_plain) and whether the embedder packs its weights all follow from it.
ONEDNN_PAYS = _onednn_pays()
# The unfused twins of the fusion tables' activations.
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
    """A linear whose weight oneDNN packed (engine.layers.packed_linear), or an nn.Linear
    where oneDNN pays (its weight goes to oneDNN as it is). Not an Fp8Linear, and not an
    nn.Linear on an AVX2-only CPU, where MKL's sgemm is the faster."""
    return type(linear) is PackedLinear or (ONEDNN_PAYS and type(linear) is nn.Linear)


def linear_act(x: torch.Tensor, linear: nn.Module, act: str) -> torch.Tensor:
    """act(linear(x)); x: [num_tokens, in] -> [num_tokens, out]. Only a plain (or packed)
    linear fuses; another layer (Fp8Linear) runs its own matmul, then the activation."""
    onednn_activations, in_place_gelu = fusion_tables(ONEDNN_PAYS)
    if _is_plain(linear) and _can_fuse(x) and act in onednn_activations:
        attr, algorithm = onednn_activations[act]
        return torch.ops.mkldnn._linear_pointwise(x, linear.weight, linear.bias, attr, [], algorithm)
    if act in in_place_gelu and not torch.is_grad_enabled():
        return torch.ops.aten.gelu_(linear(x), approximate=in_place_gelu[act])
    return ACTIVATIONS[act](linear(x))


def linear_residual(x: torch.Tensor, linear: nn.Module, residual: torch.Tensor) -> torch.Tensor:
    """residual + linear(x); x: [num_tokens, in], residual: [num_tokens, out]."""
    if (_is_plain(linear) and _can_fuse(x) and residual.is_contiguous()
            and residual.dtype == x.dtype):
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual, linear.weight, linear.bias, "add")
    if type(linear) is nn.Linear and residual.dtype == x.dtype and x.dim() == 2:
        # The matmul accumulates into residual + bias (sgemm's beta = 1), made in one pass,
        # where F.linear would copy the bias out, multiply, and take another pass to add.
        if linear.bias is None:
            return torch.addmm(residual, x, linear.weight.t())
        return (residual + linear.bias).addmm_(x, linear.weight.t())
    return residual + linear(x)


def linear_unbiased(x: torch.Tensor, linear: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(x's product with the weight, the bias still to add) for a plain or packed linear,
    so that a fused kernel after it adds the bias in the same pass as its own work
    (engine/kernels/fused_encoder_ops.py); (linear(x), None) for another layer (Fp8Linear)."""
    if type(linear) is nn.Linear:
        return F.linear(x, linear.weight), linear.bias
    if type(linear) is PackedLinear:
        return torch.ops.mkldnn._linear_pointwise(x, linear.weight, None, "none", [], ""), linear.bias
    return linear(x), None
