"""Self-attention over a packed batch: one dense call per run of equal-length texts."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.batching import AttentionGroup


def varlen_attention(qkv: torch.Tensor, groups: tuple[AttentionGroup, ...], num_heads: int) -> torch.Tensor:
    """qkv: [num_tokens, 3 * hidden] (q | k | v, heads inside each) -> [num_tokens, hidden].

    Bidirectional: a token attends to every token of its own text and to nothing else.
    Each group is a view of the flat tensor, so no mask and no padding: SDPA's fused
    CPU kernel takes the strided views as they are.
    """
    num_tokens, width = qkv.shape
    hidden = width // 3
    head_dim = hidden // num_heads
    out = qkv.new_empty(num_tokens, hidden)
    for group in groups:
        end = group.start + group.num_tokens
        # [num_seqs, seq_len, 3, heads, head_dim] -> 3 x [num_seqs, heads, seq_len, head_dim]
        q, k, v = qkv[group.start:end].view(group.num_seqs, group.seq_len, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v)
        out[group.start:end].view(group.num_seqs, group.seq_len, num_heads, head_dim).copy_(attended.transpose(1, 2))
    return out


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: tuple[AttentionGroup, ...],
                     masks: tuple[torch.Tensor | None, ...] | None = None, is_causal: bool = False) -> torch.Tensor:
    """q [num_tokens, num_heads, head_dim], k/v [num_tokens, num_kv_heads, head_dim] -> like q.

    The unfused twin of varlen_attention, for models that rotate q and k first. Each
    text attends only to itself; within it, `is_causal` (decoders) limits a token to
    those before it, and masks[i] (bool [seq_len, seq_len] for groups[i], None: no
    limit) to a band (ModernBERT's local layers). Fewer kv heads than query heads is
    grouped-query attention.
    """
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    out = torch.empty_like(q)
    for index, group in enumerate(groups):
        rows = slice(group.start, group.start + group.num_tokens)
        shape = (group.num_seqs, group.seq_len)
        # [num_tokens, heads, head_dim] -> [num_seqs, heads, seq_len, head_dim], views only
        qg, kg, vg = (x[rows].unflatten(0, shape).transpose(1, 2) for x in (q, k, v))
        mask = masks[index] if masks is not None else None
        if mask is not None and is_causal:       # SDPA takes a mask or is_causal, not both
            mask = mask.tril()
        attended = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=mask, is_causal=is_causal and mask is None,
                                                  enable_gqa=num_kv_heads != num_heads)
        out[rows].unflatten(0, shape).copy_(attended.transpose(1, 2))
    return out


def band_masks(groups: tuple[AttentionGroup, ...], half_window: int, device: torch.device,
               ) -> tuple[torch.Tensor | None, ...]:
    """Per group, bool [seq_len, seq_len]: True where |query - key| <= half_window; None for
    texts short enough that the band covers them whole (no mask, the fast kernel)."""
    masks = {}
    for group in groups:
        if group.seq_len > half_window + 1 and group.seq_len not in masks:
            positions = torch.arange(group.seq_len, device=device)
            masks[group.seq_len] = (positions[:, None] - positions[None, :]).abs() <= half_window
    return tuple(masks.get(group.seq_len) for group in groups)
