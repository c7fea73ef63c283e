"""Attention over the paged KV cache, and the per-step metadata that describes the batch.

NOTE: the batch is one flat run of tokens from many sequences, decodes first:

    tokens:  [d0 d1 d2 | p0 p0 p0 p0 | p1 p1]      d = one decode token, p = a prefill chunk
    cache:   [num_kv_heads, num_blocks, block_size, head_dim] per layer, K and V apart
             (E4M3 with a scale per slot and kv head where kv_cache_dtype="fp8": kv_cache.py)

Every new token's K/V is written to its slot first; then each sequence attends over
its whole context (cached tokens + new ones). On CPU, decodes run in the compiled
kernel of engine/kernels/cpu_ops.py, which reads K/V where they lie in the blocks; that
is most of the attention work once outputs grow. Without it (and for prefill chunks
after cached tokens) the context is gathered back from the block table and attended
with batched matmuls: decodes then go in groups of similar context length, so the
padding each group pays stays small, and grouped-query heads share their K/V rather
than copying it per query head.

NOTE: on CUDA every token goes through one Triton kernel instead
(engine/kernels/paged_attention.py): decodes and prefill chunks alike read K/V where they
lie, from FlatMetadata — flat tensors built once per step, whose shapes depend only on the
batch's size, so a CUDA graph can hold them (engine/generate/cuda_graph.py). There is no
per-shape plan (cuDNN's SDPA built one per prefill length) and no gather of the context.
BARGE_ATTENTION_BACKEND=triton takes that path on CPU too (under TRITON_INTERPRET=1 in
tests); "native" keeps the CPU path on any device.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.generate.kv_cache import LayerKVCache, dequantize_rows, store_kv
from engine.kernels import cpu_ops


@dataclass
class DecodeGroup:
    """Sequences that add exactly one token this step, of similar context length."""

    start: int                  # index of the group's first token in the flat batch
    block_table: torch.Tensor   # long [num_seqs, max_num_blocks]: each sequence's blocks (0 = padding)
    context_lens: torch.Tensor  # long [num_seqs]: cached tokens + the new one
    bias: torch.Tensor | None   # [num_seqs, max_num_blocks * block_size]: 0 on real context tokens, -inf
                                # beyond; None when the group goes to the compiled CPU kernel


@dataclass
class PrefillChunk:
    """A run of new tokens of one sequence, after num_context_tokens - num_new_tokens cached ones."""

    start: int                  # index of its first token in the flat batch
    num_new_tokens: int
    block_ids: torch.Tensor | None  # long [num_blocks]: its block table; None when nothing is cached before it
    num_context_tokens: int
    mask: torch.Tensor | None   # bool [num_new_tokens, num_context_tokens]; None means plain causal


@dataclass
class FlatMetadata:
    """The whole batch for the Triton kernel: sequence s's new tokens are rows
    query_start_loc[s]:query_start_loc[s + 1], the last of its seq_lens[s] context tokens."""

    query_start_loc: torch.Tensor   # int32 [num_seqs + 1]
    seq_lens: torch.Tensor          # int32 [num_seqs]: cached tokens + new ones (0: a padding row of a graph)
    block_tables: torch.Tensor      # int32 [num_seqs, max_num_blocks]: each sequence's blocks; read up to seq_len
    max_query_len: int              # most new tokens of any sequence (host int: it sizes the grid)


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # long [num_tokens]: where each new token's K/V is written
    decodes: list[DecodeGroup]  # the first tokens, one per decoding sequence
    prefills: list[PrefillChunk]
    flat: FlatMetadata | None = None    # set: the Triton kernel attends every token; decodes/prefills are empty


BACKENDS = ("auto", "native", "triton")


def attention_backend(device: torch.device) -> str:
    """"triton" (the paged kernel for every token) or "native" (the CPU path above):
    BARGE_ATTENTION_BACKEND, whose default "auto" means triton on CUDA, native elsewhere."""
    chosen = os.environ.get("BARGE_ATTENTION_BACKEND", "auto").strip().lower() or "auto"
    if chosen not in BACKENDS:
        raise ValueError(f"BARGE_ATTENTION_BACKEND must be one of {', '.join(BACKENDS)}, got {chosen!r}")
    if chosen == "auto":
        return "triton" if device.type == "cuda" else "native"
    return chosen


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: LayerKVCache,
                    meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """q [num_tokens, num_heads, head_dim], k/v [num_tokens, num_kv_heads, head_dim] -> like q.
    An fp8 cache (cache.is_fp8) is read back dequantized to q's dtype on every path."""
    store_kv(cache, k, v, meta.slot_mapping)
    if meta.flat is not None:
        from engine.kernels import paged_attention as kernel    # triton is imported only where it is used
        flat = meta.flat
        return kernel.paged_attention(q, cache.k, cache.v, flat.query_start_loc, flat.seq_lens, flat.block_tables,
                                      flat.max_query_len, scale, k_scale=cache.k_scale, v_scale=cache.v_scale)
    out = torch.empty_like(q)
    for group in meta.decodes:
        rows = slice(group.start, group.start + group.block_table.shape[0])
        if group.bias is None:
            out[rows] = cpu_ops.paged_decode(q[rows], cache.k, cache.v, group.block_table, group.context_lens, scale)
        else:
            out[rows] = _decode(q[rows], cache, group, scale)
    for chunk in meta.prefills:
        rows = slice(chunk.start, chunk.start + chunk.num_new_tokens)
        if chunk.block_ids is None:     # nothing cached: attend over the new tokens as they are
            keys, values = k[rows].transpose(0, 1), v[rows].transpose(0, 1)
        else:
            keys = _gather_blocks(cache.k, chunk.block_ids, cache.k_scale, q.dtype)[:, :chunk.num_context_tokens]
            values = _gather_blocks(cache.v, chunk.block_ids, cache.v_scale, q.dtype)[:, :chunk.num_context_tokens]
        out[rows] = _attend(q[rows], keys, values, chunk.mask, scale)
    return out


def _decode(q: torch.Tensor, cache: LayerKVCache, group: DecodeGroup, scale: float) -> torch.Tensor:
    """q [num_seqs, num_heads, head_dim]: one query per sequence, as two batched matmuls
    with the kv head leading, so each K/V row is read once for all the query heads it serves."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads, context_len = cache.k.shape[0], group.bias.shape[1]
    group_size = num_heads // num_kv_heads
    keys = _gather_blocks(cache.k, group.block_table, cache.k_scale, q.dtype)
    values = _gather_blocks(cache.v, group.block_table, cache.v_scale, q.dtype)
    keys = keys.view(num_kv_heads * num_seqs, context_len, head_dim)
    values = values.view(num_kv_heads * num_seqs, context_len, head_dim)
    # query head h is served by kv head h // group_size, as in Hugging Face's repeat_kv
    queries = q.view(num_seqs, num_kv_heads, group_size, head_dim).transpose(0, 1).reshape(-1, group_size, head_dim)
    scores = torch.bmm(queries, keys.transpose(1, 2)).view(num_kv_heads, num_seqs, group_size, context_len)
    weights = (scores * scale + group.bias[None, :, None, :]).softmax(dim=-1)
    out = torch.bmm(weights.view(-1, group_size, context_len), values)
    return out.view(num_kv_heads, num_seqs, group_size, head_dim).transpose(0, 1).reshape(num_seqs, num_heads, head_dim)


def _gather_blocks(cache: torch.Tensor, block_ids: torch.Tensor, scales: torch.Tensor | None = None,
                   dtype: torch.dtype | None = None) -> torch.Tensor:
    """cache [kv_heads, num_blocks, block_size, dim], block_ids [..., n] -> [kv_heads, ..., n * block_size, dim].
    Whole blocks are copied (block_size * head_dim contiguous values each), not token by
    token: index_select over rows of whole blocks is a plain row copy, several times
    faster on CPU than advanced indexing of the 4-d cache. With scales (an fp8 cache,
    [kv_heads, num_blocks, block_size]) the rows come back dequantized to dtype."""
    num_kv_heads, num_blocks, block_size, head_dim = cache.shape
    if scales is None:
        rows = torch.index_select(cache.view(num_kv_heads, num_blocks, block_size * head_dim), 1,
                                  block_ids.reshape(-1))
        return rows.view(num_kv_heads, *block_ids.shape[:-1], block_ids.shape[-1] * block_size, head_dim)
    # as bytes: PyTorch has no index_select for fp8 on CPU
    raw = cache.view(torch.uint8).view(num_kv_heads, num_blocks, block_size * head_dim)
    rows = torch.index_select(raw, 1, block_ids.reshape(-1)).view(cache.dtype)
    row_scales = torch.index_select(scales, 1, block_ids.reshape(-1))
    shape = (num_kv_heads, *block_ids.shape[:-1], block_ids.shape[-1] * block_size)
    return dequantize_rows(rows.view(*shape, head_dim), row_scales.reshape(shape), dtype)


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
            scale: float) -> torch.Tensor:
    """One sequence: q [n, heads, dim] over keys/values [kv_heads, context, dim].

    NOTE: with a batch dimension: given 3-d tensors, PyTorch's CPU attention takes its
    unfused math path (about 8x slower on prompts of a few hundred tokens)."""
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys[None], values[None], attn_mask=mask,
                                         is_causal=mask is None, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)
