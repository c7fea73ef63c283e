"""PackedLinear: a linear layer whose weight oneDNN reordered once, at load, on CPU.

torch's F.linear hands oneDNN (or MKL) the plain [out, in] weight on every call, and
the library re-blocks it for its kernel each time; for the small row counts of a
decode step that copy costs as much as the multiply. Reordered once, the same matmul
runs at the machine's matmul rate at any row count (measured on this project's 2-core
CPU, fp32: 90-140 GFLOP/s unpacked against 170-195 packed, for 32-256 rows; the LM
head at 32 rows 59 against 156). This is what IPEX's CPU linear does.

The packed weight is an opaque oneDNN tensor: it is not a Parameter, it cannot be moved
or saved, so packing is the last step of loading a model that stays on the CPU.

NOTE: bf16 weights pack too, for the callers that ask (the embedder's bf16 path): on a
CPU with AMX oneDNN's bf16 matmul (brg_matmul:avx10_1_512_amx in ONEDNN_VERBOSE) runs
several times its fp32 rate, accumulating in fp32. The decoders and Whisper pack fp32
only, as before: `dtypes` defaults to PACKED_DTYPES.
"""

from __future__ import annotations

import torch
from torch import nn

PACKED_DTYPES = (torch.float32,)       # what pack_linears packs unless told otherwise


def _has_onednn_packing() -> bool:
    try:
        return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
                and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))
    except (AttributeError, RuntimeError):
        return False


HAS_ONEDNN_PACKING = _has_onednn_packing()


def _has_bf16_packing() -> bool:
    """oneDNN's bf16 linears need avx512bw/vl/dq (AMX makes them fast); elsewhere they raise."""
    try:
        return HAS_ONEDNN_PACKING and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


HAS_BF16_PACKING = _has_bf16_packing()


class PackedLinear(nn.Module):
    def __init__(self, linear: nn.Linear, batch_hint: int):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        with torch.no_grad():
            self.weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), batch_hint)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def can_pack(model: nn.Module, dtypes: tuple[torch.dtype, ...] = PACKED_DTYPES) -> bool:
    parameter = next(model.parameters(), None)
    if parameter is None or parameter.device.type != "cpu" or parameter.dtype not in dtypes:
        return False
    return HAS_BF16_PACKING if parameter.dtype == torch.bfloat16 else HAS_ONEDNN_PACKING


def pack_linears(model: nn.Module, batch_hint: int, dtypes: tuple[torch.dtype, ...] = PACKED_DTYPES) -> int:
    """Replace every plain nn.Linear of a CPU model in one of `dtypes` (fp32 by default;
    torch.bfloat16 may be added) with a PackedLinear (FP8 layers stay as they are);
    `batch_hint`: the row count the model mostly runs at. Returns how many were packed;
    0 where oneDNN or its reorder op is missing (or bf16 is asked and this CPU has no
    bf16 linears), or off the CPU."""
    if not can_pack(model, dtypes):
        return 0
    packed = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.dtype in dtypes:
                setattr(parent, name, PackedLinear(child, batch_hint))
                packed += 1
    return packed
