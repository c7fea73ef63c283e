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
