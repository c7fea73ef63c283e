"""Fp8Linear: a linear layer whose weight stays float8_e4m3fn in memory, and the swap that
puts it in place of nn.Linear wherever a state dict carries an FP8 scale.

Where the matmul runs (one decision per call, see `fp8_backend`):

    "w8a8"         CUDA, capability >= 8.9 (FP8 tensor cores): activations quantized per
                   token on the fly by one Triton kernel (engine/kernels/fp8_act_quant.py);
                   per-channel weights through torch._scaled_mm with row-wise scales
                   (scale_a [tokens, 1], scale_b [1, out]), block or group weights through
                   the Triton group GEMM (per-token, per-128 activation scales)
    "weight-only"  other CUDA GPUs: Triton kernel dequantizing weight tiles inside the GEMM
    "dequantize"   CPU (and anything else): dequantize this layer's weight to the compute
                   dtype for this matmul only, so FP8 bytes are what stays resident
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.quant.fp8 import FP8_DTYPE, dequantize, group_size_of

FP8_TENSOR_CORE_CAPABILITY = (8, 9)
SCALED_MM_ALIGNMENT = 16         # torch._scaled_mm wants K and N multiples of 16


class Fp8Linear(nn.Module):
    """y = x @ (q * scale).T + bias; q float8 [out, in], scale float32 [out, num_groups] (row form)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, num_groups: int, group_size: int,
                 scheme: str | None = None):
        super().__init__()
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        # "fp8" | "fp8-block" | "fp8-group" as loaded: 128x128 blocks and 1x128 groups both
        # keep row-form scales [out, in / 128], so the scales alone cannot tell them apart.
        self.scheme = scheme
        self.register_buffer("weight", torch.empty(out_features, in_features, dtype=FP8_DTYPE))
        self.register_buffer("weight_scale", torch.empty(out_features, num_groups, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    @property
    def is_per_channel(self) -> bool:
        return self.weight_scale.shape[1] == 1

    def _apply(self, fn, recurse=True):
        # Module.to(dtype) casts every floating tensor, float8 included. The weight and its
        # scale must keep their dtypes; E4M3 -> 16/32-bit -> E4M3 is exact, so undo the cast.
        super()._apply(fn, recurse)
        if self.weight.dtype != FP8_DTYPE:
            self.weight = self.weight.to(FP8_DTYPE)
        if self.weight_scale.dtype != torch.float32:
            self.weight_scale = self.weight_scale.float()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        leading = x.shape[:-1]
        out = fp8_linear(x.reshape(-1, self.in_features), self)
        return out.reshape(*leading, self.out_features)

    def extra_repr(self) -> str:
        scales = "per-channel" if self.is_per_channel else f"groups of {self.group_size}"
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 e4m3, {scales}"


def fp8_backend(device: torch.device) -> str:
    if device.type != "cuda":
        return "dequantize"
    return "w8a8" if torch.cuda.get_device_capability(device) >= FP8_TENSOR_CORE_CAPABILITY else "weight-only"


def fp8_linear(x: torch.Tensor, layer: Fp8Linear) -> torch.Tensor:
    """x [tokens, in] -> [tokens, out] in x's dtype."""
    backend = fp8_backend(x.device)
    if backend == "dequantize":
        return F.linear(x, dequantize(layer.weight, layer.weight_scale, layer.group_size, x.dtype), layer.bias)
    from engine.kernels import fp8_act_quant, fp8_matmul           # Triton only where a GPU runs it

    if backend == "w8a8" and layer.is_per_channel and _fits_scaled_mm(layer):
        return _scaled_mm_per_channel(x, layer)
    if backend == "w8a8" and not layer.is_per_channel:
        x_q, x_scale = fp8_act_quant.quantize_per_group(x, layer.group_size)
        out = fp8_matmul.fp8_w8a8_group_matmul(x_q, x_scale, layer.weight, layer.weight_scale,
                                               layer.group_size, x.dtype)
        return out if layer.bias is None else out + layer.bias
    return fp8_matmul.fp8_weight_only_matmul(x, layer.weight, layer.weight_scale, layer.group_size, layer.bias)


def _fits_scaled_mm(layer: Fp8Linear) -> bool:
    return layer.in_features % SCALED_MM_ALIGNMENT == 0 and layer.out_features % SCALED_MM_ALIGNMENT == 0


def _scaled_mm_per_channel(x: torch.Tensor, layer: Fp8Linear) -> torch.Tensor:
    # Row-wise scaling: scale_a [tokens, 1] (dynamic, per token) and scale_b [1, out]; cuBLAS
    # applies both in the epilogue. It wants the second operand column-major: weight.t() is.
    from engine.kernels.fp8_act_quant import quantize_per_token
    x_q, x_scale = quantize_per_token(x)
    bias = None if layer.bias is None else layer.bias.to(torch.bfloat16)
    out = torch._scaled_mm(x_q, layer.weight.t(), scale_a=x_scale, scale_b=layer.weight_scale.reshape(1, -1),
                           bias=bias, out_dtype=torch.bfloat16)
    return out.to(x.dtype)


def use_fp8_linears(model: nn.Module, state: dict[str, torch.Tensor], block_cols: int | None,
                    scheme: str | None = None) -> list[str]:
    """Replace each nn.Linear whose `<name>.weight_scale` is in `state` by an Fp8Linear of the
    same shape (on the meta device when the model is), before the state is assigned. Generic
    over modules: any model with nn.Linear layers, Whisper's included. Returns the names."""
    swapped = []
    for name, module in list(model.named_modules()):
        scale = state.get(f"{name}.weight_scale")
        if scale is None or not isinstance(module, nn.Linear):
            continue
        group_size = group_size_of(module.in_features, scale.shape[1], block_cols or module.in_features)
        with torch.device(module.weight.device):
            layer = Fp8Linear(module.in_features, module.out_features, module.bias is not None,
                              scale.shape[1], group_size, scheme)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, layer)
        swapped.append(name)
    return swapped


def fp8_weight_bytes(model: nn.Module) -> tuple[int, int]:
    """(bytes of the FP8 layers' weights and scales as stored, bytes the same weights take in bf16)."""
    stored = bf16 = 0
    for module in model.modules():
        if isinstance(module, Fp8Linear):
            stored += module.weight.nbytes + module.weight_scale.nbytes
            bf16 += module.weight.numel() * 2
    return stored, bf16
