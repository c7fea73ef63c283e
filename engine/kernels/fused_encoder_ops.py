"""The encoder layers' small ops fused into one Triton kernel each, for CUDA (tested on CPU
with TRITON_INTERPRET=1 against the PyTorch ops they replace, which stay the CPU path):

    kernel                 computes                                    launches besides the matmuls
    layer_norm             LayerNorm(x + x_bias + residual)            2 -> 1 (BERT's post-norm)
    add_layer_norm_        residual += x + x_bias in place, then
                           LayerNorm(residual)                         2 -> 1 (ModernBERT's pre-norm)
    embedding_layer_norm   LayerNorm(word[id] + position[pos] + row)   6 -> 1 (BERT's embeddings; 2 ModernBERT's)
    bias_gelu_             x = gelu(x + bias) in place                 1 -> 1 (the bias leaves the matmul)
    gelu_and_mul           [inner | gate] (+ bias) -> gelu(inner) * gate  2 -> 1 (ModernBERT's GeGLU)

x_bias is a linear layer's bias taken out of its matmul (engine.layers.linear.linear_unbiased),
so the product, its bias, the residual and the norm cost one read and one write of each
element between two matmuls.

NOTE: each kernel reads its inputs in their dtype (fp32, fp16 or bf16), computes in fp32 and
rounds where the PyTorch ops it replaces round: the summed inputs of a norm to the
activation dtype before they are normalised (as PyTorch's adds leave them), the output
once (PyTorch's LayerNorm computes in fp32 too), a linear's biased output before GELU,
gelu(inner) before the product. Results
stay within the dtype's rounding of the reference, and equal it in fp32 up to the order
of the sums. One program handles one row for the norms (a token: hundreds to a few
thousand columns); the elementwise GELUs run a block of a row each, no index divided. None
syncs with the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

GELU_APPROXIMATIONS = ("none", "tanh")      # F.gelu's `approximate`: erf (BERT's "gelu"), or the tanh form
ELEMENTWISE_BLOCKS = (256, 512, 1024)


@triton.jit
def _layer_norm_row(x, mask, num_cols, weight_ptr, bias_ptr, out_ptr, cols, eps, HAS_BIAS: tl.constexpr):
    """Store LayerNorm of one row x (fp32, zero where masked) at out_ptr + cols."""
    mean = tl.sum(x, axis=0) / num_cols
    centered = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / num_cols + eps)
    normed = centered * rstd * tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        normed += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + cols, normed.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _layer_norm_kernel(x_ptr, x_bias_ptr, residual_ptr, weight_ptr, bias_ptr, out_ptr, num_cols,
                       stride_x, stride_r, stride_o, eps, HAS_X_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                       STORE_SUM: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < num_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_X_BIAS:
        x += tl.load(x_bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x += tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
    x = x.to(x_ptr.dtype.element_ty)        # the sum in the activation dtype, as PyTorch's adds leave it
    if STORE_SUM:
        tl.store(residual_ptr + row * stride_r + cols, x, mask=mask)
    _layer_norm_row(x.to(tl.float32), mask, num_cols, weight_ptr, bias_ptr, out_ptr + row * stride_o, cols, eps,
                    HAS_BIAS)


@triton.jit
def _embedding_layer_norm_kernel(ids_ptr, positions_ptr, word_ptr, position_table_ptr, row_ptr, weight_ptr, bias_ptr,
                                 out_ptr, num_cols, stride_word, stride_position, stride_o, position_offset, eps,
                                 HAS_POSITIONS: tl.constexpr, HAS_ROW: tl.constexpr, HAS_BIAS: tl.constexpr,
                                 BLOCK: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < num_cols
    token_id = tl.load(ids_ptr + token).to(tl.int64)
    x = tl.load(word_ptr + token_id * stride_word + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_POSITIONS:
        position = tl.load(positions_ptr + token).to(tl.int64) + position_offset
        x += tl.load(position_table_ptr + position * stride_position + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_ROW:
        x += tl.load(row_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    x = x.to(word_ptr.dtype.element_ty).to(tl.float32)
    _layer_norm_row(x, mask, num_cols, weight_ptr, bias_ptr, out_ptr + token * stride_o, cols, eps, HAS_BIAS)


@triton.jit
def _gelu(x, APPROXIMATE_TANH: tl.constexpr):
    """F.gelu of fp32 x: the erf form, or the tanh form (tanh(z) = 1 - 2 / (exp(2z) + 1))."""
    if APPROXIMATE_TANH:
        # Clamped where tanh(z) is 1 in fp32 already: exp(2z) stays finite.
        z = tl.minimum(0.7978845608028654 * (x + 0.044715 * x * x * x), 20.0)
        return 0.5 * x * (2.0 - 2.0 / (tl.exp(2.0 * z) + 1.0))
    return 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))


@triton.jit
def _bias_gelu_kernel(x_ptr, bias_ptr, num_cols, stride_x, HAS_BIAS: tl.constexpr,
                      APPROXIMATE_TANH: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = col < num_cols
    x = tl.load(x_ptr + row * stride_x + col, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x += tl.load(bias_ptr + col, mask=mask, other=0.0).to(tl.float32)
        x = x.to(x_ptr.dtype.element_ty).to(tl.float32)     # the biased output PyTorch's linear gives GELU
    tl.store(x_ptr + row * stride_x + col, _gelu(x, APPROXIMATE_TANH).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_and_mul_kernel(x_ptr, bias_ptr, out_ptr, size, stride_x, stride_out, HAS_BIAS: tl.constexpr,
                         APPROXIMATE_TANH: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = col < size
    inner = tl.load(x_ptr + row * stride_x + col, mask=mask, other=0.0).to(tl.float32)
    gate = tl.load(x_ptr + row * stride_x + size + col, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        inner += tl.load(bias_ptr + col, mask=mask, other=0.0).to(tl.float32)
        gate += tl.load(bias_ptr + size + col, mask=mask, other=0.0).to(tl.float32)
        # The linear's output, biased, in the activation dtype: what the PyTorch path multiplies.
        inner = inner.to(out_ptr.dtype.element_ty).to(tl.float32)
        gate = gate.to(out_ptr.dtype.element_ty).to(tl.float32)
    activated = _gelu(inner, APPROXIMATE_TANH).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_out + col, (activated * gate).to(out_ptr.dtype.element_ty), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"expected a 2-D tensor with contiguous rows, got shape {tuple(x.shape)} "
                         f"and strides {x.stride()}")
    return x


def _num_warps(block: int) -> int:
    return min(max(block // 256, 1), 8)


def _column_block(num_cols: int) -> int:
    """The elementwise kernels' block of a row: the one of 256, 512 or 1024 columns that
    leaves fewest masked lanes (the larger on a tie; 1,536 -> 512, 3,072 -> 1,024)."""
    return min(sorted(ELEMENTWISE_BLOCKS, reverse=True), key=lambda block: -num_cols % block)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float,
               residual: torch.Tensor | None = None, x_bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, hidden] -> LayerNorm(x + x_bias + residual) [rows, hidden] in x's dtype; x_bias
    [hidden] and residual [rows, hidden] are optional. Nothing but the output is written."""
    return _layer_norm(x, residual, x_bias, weight, bias, eps, store_sum=False)


def add_layer_norm_(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    eps: float, x_bias: torch.Tensor | None = None) -> torch.Tensor:
    """residual += x + x_bias in place (in residual's dtype), then LayerNorm of the sum."""
    return _layer_norm(x, residual, x_bias, weight, bias, eps, store_sum=True)


def _layer_norm(x, residual, x_bias, weight, bias, eps, store_sum):
    x = _rows(x)
    if residual is not None and (_rows(residual).shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"x {tuple(x.shape)} {x.dtype} and residual {tuple(residual.shape)} {residual.dtype} "
                         f"must have one shape and dtype")
    num_rows, num_cols = x.shape
    out = torch.empty_like(x)
    if num_rows:
        block = triton.next_power_of_2(num_cols)
        _layer_norm_kernel[(num_rows,)](
            x, x_bias if x_bias is not None else x, residual if residual is not None else x, weight,
            bias if bias is not None else weight, out, num_cols, x.stride(0),
            residual.stride(0) if residual is not None else 0, out.stride(0), eps,
            HAS_X_BIAS=x_bias is not None, HAS_RESIDUAL=residual is not None, STORE_SUM=store_sum,
            HAS_BIAS=bias is not None, BLOCK=block, num_warps=_num_warps(block))
    return out


def embedding_layer_norm(input_ids: torch.Tensor, word_table: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None, eps: float, positions: torch.Tensor | None = None,
                         position_table: torch.Tensor | None = None, position_offset: int = 0,
                         row: torch.Tensor | None = None) -> torch.Tensor:
    """input_ids [num_tokens] -> LayerNorm(word_table[id] + position_table[position + position_offset]
    + row) [num_tokens, hidden] in the tables' dtype; positions (with their table) and row
    [hidden] (BERT's token type 0) are optional. The ids are not range-checked."""
    num_tokens, num_cols = input_ids.shape[0], word_table.shape[1]
    if (positions is None) != (position_table is None):
        raise ValueError("positions and position_table come together")
    out = torch.empty(num_tokens, num_cols, dtype=word_table.dtype, device=word_table.device)
    if num_tokens:
        block = triton.next_power_of_2(num_cols)
        _embedding_layer_norm_kernel[(num_tokens,)](
            input_ids, positions if positions is not None else input_ids, _rows(word_table),
            _rows(position_table) if position_table is not None else word_table,
            row if row is not None else weight, weight, bias if bias is not None else weight, out, num_cols,
            word_table.stride(0), position_table.stride(0) if position_table is not None else 0, out.stride(0),
            position_offset, eps, HAS_POSITIONS=positions is not None, HAS_ROW=row is not None,
            HAS_BIAS=bias is not None, BLOCK=block, num_warps=_num_warps(block))
    return out


def _approximate_tanh(approximate: str) -> bool:
    if approximate not in GELU_APPROXIMATIONS:
        raise ValueError(f"unsupported GELU approximate {approximate!r}; expected one of {GELU_APPROXIMATIONS}")
    return approximate == "tanh"


def bias_gelu_(x: torch.Tensor, bias: torch.Tensor | None, approximate: str = "none") -> torch.Tensor:
    """x [rows, size] = F.gelu(x + bias, approximate=approximate) in place; returns x."""
    tanh = _approximate_tanh(approximate)
    num_rows, num_cols = _rows(x).shape
    if x.numel():
        block = _column_block(num_cols)
        _bias_gelu_kernel[(num_rows, triton.cdiv(num_cols, block))](
            x, bias if bias is not None else x, num_cols, x.stride(0), HAS_BIAS=bias is not None,
            APPROXIMATE_TANH=tanh, BLOCK=block)
    return x


def gelu_and_mul(x: torch.Tensor, bias: torch.Tensor | None = None, approximate: str = "none") -> torch.Tensor:
    """x [rows, 2 * size] (inner first, then gate: a GeGLU's fused input projection), plus
    bias [2 * size] -> F.gelu(inner) * gate [rows, size]."""
    tanh = _approximate_tanh(approximate)
    x = _rows(x)
    num_rows, size = x.shape[0], x.shape[1] // 2
    out = torch.empty(num_rows, size, dtype=x.dtype, device=x.device)
    if out.numel():
        block = _column_block(size)
        _gelu_and_mul_kernel[(num_rows, triton.cdiv(size, block))](
            x, bias if bias is not None else x, out, size, x.stride(0), out.stride(0), HAS_BIAS=bias is not None,
            APPROXIMATE_TANH=tanh, BLOCK=block)
    return out
