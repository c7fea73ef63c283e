"""Attention over the paged KV cache, and the per-step metadata that describes the batch.

NOTE: the batch is one flat run of tokens from many sequences, decodes first:

    tokens:  [d0 d1 d2 | p0 p0 p0 p0 | p1 p1]      d = one decode token, p = a prefill chunk
    cache:   [num_blocks * block_size, num_kv_heads, head_dim] per layer, K and V apart

Every new token's K/V is written to its slot first; then each sequence attends over
its whole context (cached tokens + new ones) gathered back from its block table.
On CPU that gather plus torch SDPA is the kernel: correct, and fast enough that the
matmuls dominate. A GPU build swaps this module for a Triton paged-attention kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class DecodeBatch:
    """Sequences that add exactly one token this step, attended in one padded SDPA call."""

    slots: torch.Tensor         # long [num_decodes, max_context_len]: cache slot of each context token (0 = padding)
    mask: torch.Tensor          # bool [num_decodes, 1, 1, max_context_len]: True where a real context token is


@dataclass
class PrefillChunk:
    """A run of new tokens of one sequence, after num_context_tokens - num_new_tokens cached ones."""

    start: int                  # index of its first token in the flat batch
    num_new_tokens: int
    slots: torch.Tensor | None  # long [num_context_tokens]; None when nothing is cached before it
    mask: torch.Tensor | None   # bool [num_new_tokens, num_context_tokens]; None means plain causal


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # long [num_tokens]: where each new token's K/V is written
    num_decodes: int            # the first num_decodes tokens are one-token decodes
    decode: DecodeBatch | None
    prefills: list[PrefillChunk]


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """q [num_tokens, num_heads, head_dim], k/v [num_tokens, num_kv_heads, head_dim] -> like q."""
    k_cache.index_copy_(0, meta.slot_mapping, k)
    v_cache.index_copy_(0, meta.slot_mapping, v)
    out = torch.empty_like(q)
    if meta.decode is not None:
        out[:meta.num_decodes] = _decode(q[:meta.num_decodes], k_cache, v_cache, meta.decode, scale)
    for chunk in meta.prefills:
        rows = slice(chunk.start, chunk.start + chunk.num_new_tokens)
        if chunk.slots is None:     # nothing cached: attend over the new tokens as they are
            keys, values = k[rows], v[rows]
        else:
            keys, values = k_cache[chunk.slots], v_cache[chunk.slots]
        out[rows] = _attend(q[rows], keys, values, chunk.mask, scale)
    return out


def _decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: DecodeBatch,
            scale: float) -> torch.Tensor:
    keys = k_cache[batch.slots].transpose(1, 2)       # [num_decodes, num_kv_heads, max_context_len, head_dim]
    values = v_cache[batch.slots].transpose(1, 2)
    out = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=batch.mask,
                                         scale=scale, enable_gqa=True)
    return out.squeeze(2)


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
            scale: float) -> torch.Tensor:
    """One sequence: q [n, heads, dim] over keys/values [context, kv_heads, dim]."""
    out = F.scaled_dot_product_attention(q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
                                         attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True)
    return out.transpose(0, 1)
