"""PackedLinear: a linear layer whose weight oneDNN reordered once, at load, on CPU.

torch's F.linear hands oneDNN (or MKL) the plain [out, in] weight on every call, and
the library re-blocks it for its kernel each time; for the small row counts of a
decode step that copy costs as much as the multiply. Reordered once, the same matmul
runs at the machine's matmul rate at any row count (measured on this project's 2-core
CPU, fp32: 90-140 GFLOP/s unpacked against 170-195 packed, for 32-256 rows; the LM
head at 32 rows 59 against 156). This is what IPEX's CPU linear does.

The packed weight is an opaque oneDNN tensor: it is not a Parameter, it cannot be moved
or saved, so packing is the last step of loading a model that stays on the CPU.
"""

from __future__ import annotations

import torch
from torch import nn

PACKED_DTYPES = (torch.float32,)


def _has_onednn_packing() -> bool:
    try:
        return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
                and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))
    except (AttributeError, RuntimeError):
        return False


HAS_ONEDNN_PACKING = _has_onednn_packing()


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


def can_pack(model: nn.Module) -> bool:
    parameter = next(model.parameters(), None)
    return (HAS_ONEDNN_PACKING and parameter is not None and parameter.device.type == "cpu"
            and parameter.dtype in PACKED_DTYPES)


def pack_linears(model: nn.Module, batch_hint: int) -> int:
    """Replace every plain nn.Linear of a CPU fp32 model with a PackedLinear (FP8 layers
    stay as they are); `batch_hint`: the row count the model mostly runs at. Returns
    how many were packed; 0 where oneDNN or its reorder op is missing, or off the CPU."""
    if not can_pack(model):
        return 0
    packed = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.dtype in PACKED_DTYPES:
                setattr(parent, name, PackedLinear(child, batch_hint))
                packed += 1
    return packed
