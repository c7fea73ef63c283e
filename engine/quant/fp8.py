"""FP8 (E4M3) quantization math: weights per output channel or per 2-D block, activations
per token (or per token and K group).

Scale convention, everywhere in Barge: a scale is the multiplier that dequantizes,
`weight ≈ q.float() * scale` — what Hugging Face calls `weight_scale_inv` and
compressed-tensors calls `weight_scale` (the same number under two names).

In memory a layer's scales are in *row form*: `scale[n, g]` is the scale of row n over
input columns g * group_size ... (g + 1) * group_size - 1, float32 [out, num_groups].

    per-channel      group_size = in_features        scale [out, 1]
    128x128 blocks   group_size = 128                scale [out, ceil(in / 128)]
                     (each block's scale repeated on its 128 rows)

Row form costs 4 bytes per 128 weights (3 % of the FP8 bytes) and buys one thing that
must stay true: fusing Q/K/V or gate/up is a plain row concatenation of weights and
scales, even where a part's row count is not a multiple of the block height.

NOTE: scale_method "mse" (the default recipe's, engine/quant/recipe.py) picks each row's or
block's scale by searching SCALE_RATIOS x amax / 448 for the least squared round-trip
error. E4M3's grid is relative (3 mantissa bits), so moving the scale within one octave
(ratios 1 to 2) realigns every value on the grid without clipping anything, and ratios
below 1 clip the largest values to land the rest on a finer grid; "absmax" (ratio 1) is
one candidate, so the search is never worse than it on the squared error it minimises.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max         # 448.0
# An all-zero row or block would get scale 0 and divide by it; this floor keeps q = 0.
MIN_SCALE = 1e-12
DEFAULT_BLOCK_SIZE = (128, 128)
SCALE_METHODS = ("absmax", "mse")
# 2^(k/16), k = -4 .. 15: ratio 1 (absmax) included, one octave above it, a little clipping below.
SCALE_RATIOS = tuple(2 ** (k / 16) for k in range(-4, 16))


def _check_weight(weight: torch.Tensor) -> None:
    if weight.dim() != 2:
        raise ValueError(f"expected a 2-D linear weight [out, in], got shape {tuple(weight.shape)}")
    if not weight.is_floating_point() or weight.dtype == FP8_DTYPE:
        raise ValueError(f"expected a 16/32-bit float weight, got dtype {weight.dtype}")


def _to_fp8(values: torch.Tensor) -> torch.Tensor:
    # Saturate: a value that rounds past 448 must not become NaN (E4M3FN has no infinity).
    return values.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def check_scale_method(scale_method: str) -> str:
    if scale_method not in SCALE_METHODS:
        raise ValueError(f"unsupported scale method {scale_method!r}; expected one of {SCALE_METHODS}")
    return scale_method


def search_scales(groups: torch.Tensor, dims: tuple[int, ...], scale_method: str = "absmax") -> torch.Tensor:
    """float32 values -> the dequantizing scale of each group reduced over `dims` (kept as
    size-1 dims): amax / 448, or with "mse" the candidate of least squared round-trip error."""
    amax = groups.abs().amax(dim=dims, keepdim=True)
    if check_scale_method(scale_method) == "absmax":
        return (amax / FP8_MAX).clamp(min=MIN_SCALE)
    best_scale, best_error = None, None
    for ratio in SCALE_RATIOS:      # one candidate at a time: memory stays at one copy of the weight
        scale = (amax * ratio / FP8_MAX).clamp(min=MIN_SCALE)
        error = (_to_fp8(groups / scale).float() * scale - groups).square().sum(dim=dims, keepdim=True)
        if best_scale is None:
            best_scale, best_error = scale, error
        else:
            is_better = error < best_error      # strict: ties keep the earlier ratio (absmax first)
            best_scale, best_error = torch.where(is_better, scale, best_scale), torch.minimum(error, best_error)
    return best_scale


def quantize_per_channel(weight: torch.Tensor, scale_method: str = "absmax") -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] -> (q float8 [out, in], scale float32 [out, 1]), one scale per output row."""
    _check_weight(weight)
    weight = weight.float()
    scale = search_scales(weight, (1,), scale_method)
    return _to_fp8(weight / scale), scale


def quantize_blocks(weight: torch.Tensor, block_size: tuple[int, int] = DEFAULT_BLOCK_SIZE,
                    scale_method: str = "absmax") -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] -> (q float8 [out, in], scale float32 [ceil(out/bn), ceil(in/bk)]).

    The scale has Hugging Face's `weight_scale_inv` layout. Shapes that are not multiples
    of the block are zero-padded for the amax (and the search's error) only: edge blocks
    are simply smaller. block_size (1, 128) gives per-group scales, one per row and 128 columns.
    """
    _check_weight(weight)
    block_rows, block_cols = check_block_size(block_size)
    rows, cols = weight.shape
    num_row_blocks, num_col_blocks = -(-rows // block_rows), -(-cols // block_cols)
    padded = weight.new_zeros(num_row_blocks * block_rows, num_col_blocks * block_cols, dtype=torch.float32)
    padded[:rows, :cols] = weight.float()
    blocks = padded.view(num_row_blocks, block_rows, num_col_blocks, block_cols)
    scale = search_scales(blocks, (1, 3), scale_method)
    q = _to_fp8(blocks / scale).view_as(padded)[:rows, :cols].contiguous()
    return q, scale[:, 0, :, 0].contiguous()


def check_block_size(block_size) -> tuple[int, int]:
    if (not isinstance(block_size, (tuple, list)) or len(block_size) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in block_size)):
        raise ValueError(f"block size must be two positive ints [rows, cols], got {block_size!r}")
    return int(block_size[0]), int(block_size[1])


def block_scales_to_rows(scale: torch.Tensor, num_rows: int, block_rows: int) -> torch.Tensor:
    """Block scales [ceil(out/bn), num_groups] -> row form [out, num_groups] (float32)."""
    if scale.dim() != 2 or scale.shape[0] != -(-num_rows // block_rows):
        raise ValueError(f"block scale of shape {tuple(scale.shape)} does not fit {num_rows} rows "
                         f"in blocks of {block_rows}")
    return scale.float().repeat_interleave(block_rows, dim=0)[:num_rows].contiguous()


def rows_to_block_scales(scale: torch.Tensor, block_rows: int) -> torch.Tensor:
    """Row form -> block scales, for writing a checkpoint: one row per block (they are equal)."""
    return scale[::block_rows].contiguous()


def group_size_of(in_features: int, num_groups: int, block_cols: int) -> int:
    """The K group a row-form scale covers: the whole row for one group, else the block width."""
    return in_features if num_groups == 1 else block_cols


def expand_scale(scale: torch.Tensor, in_features: int, group_size: int) -> torch.Tensor:
    """Row-form scale [out, num_groups] -> one scale per weight [out, in]."""
    if scale.shape[1] == 1:
        return scale
    return scale.repeat_interleave(group_size, dim=1)[:, :in_features]


def dequantize(q: torch.Tensor, scale: torch.Tensor, group_size: int,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """q float8 [out, in], row-form scale -> weight [out, in] of dtype (multiplied in float32)."""
    if q.dtype != FP8_DTYPE:
        raise ValueError(f"expected float8_e4m3fn weights, got {q.dtype}")
    return (q.float() * expand_scale(scale.float(), q.shape[1], group_size)).to(dtype)


def quantize_activations(x: torch.Tensor, group_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [tokens, in] -> (q float8 [tokens, in], scale float32 [tokens, num_groups]).

    Dynamic per-token scales (group_size None: one per token) or per token and K group of
    group_size columns, the activation half of 128x128 block W8A8.
    """
    x = x.float()
    tokens, cols = x.shape
    group_size = group_size or cols
    num_groups = -(-cols // group_size)
    padded = torch.nn.functional.pad(x, (0, num_groups * group_size - cols)).view(tokens, num_groups, group_size)
    scale = (padded.abs().amax(dim=2) / FP8_MAX).clamp(min=MIN_SCALE)
    q = _to_fp8(padded / scale[:, :, None]).view(tokens, -1)[:, :cols].contiguous()
    return q, scale
