"""Self-attention over a packed batch.

On CUDA: one Triton varlen kernel call for the whole batch (engine/kernels/varlen_attention.py),
texts delimited by the batch's cu_seqlens. On CPU in fp32: one call of the compiled CPU
kernel for the whole batch (engine/kernels/cpu/varlen_attention.cpp). Elsewhere (no
compiler, BARGE_CPU_KERNELS=0; CUDA without Triton or with head_dim over the kernel's
limit): one dense SDPA call per run of equal-length texts (views of the flat tensor, no
padding).

NOTE: an encoder's bf16 attention on CPU (varlen_attention, the embedder's AMX path)
widens q|k|v to fp32 and takes the compiled fp32 kernel, then narrows the output. SDPA
per group in bf16 took most of the forward's time once AMX made the linears fast (43 %
of MiniLM's, in a profile on this project's 2-core Xeon), and the widening costs two
passes over [num_tokens, 3 * hidden]; softmax and P·V stay in fp32 as a bonus.
packed_attention (decoders, ModernBERT) keeps its paths: bf16 there is SDPA per group.

Texts behind a shared prefix (an LLM embedder's instruction run once, engine.embed.batching.
SharedPrefix) take attend_after_prefix: SDPA per group on every device, the kernels taking
no prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F

from engine.embed.batching import AttentionGroup
from engine.embed.batching import cu_seqlens as groups_cu_seqlens
from engine.kernels import cpu_ops

KERNEL_MAX_HEAD_DIM = 128      # engine.kernels.varlen_attention.MAX_HEAD_DIM, without importing Triton


@dataclass(frozen=True)
class SlidingWindow:
    """Local attention (ModernBERT): a token sees only those at most half_window positions away."""

    half_window: int
    masks: tuple[torch.Tensor | None, ...] | None   # band_masks per group for the SDPA path; None: not built


def sliding_window(groups: tuple[AttentionGroup, ...], half_window: int, like: torch.Tensor) -> SlidingWindow:
    """The window of one forward pass, shared by its local layers; `like`: a tensor of the
    pass's device and dtype. The masks are built only where SDPA will need them: the
    kernels (Triton on GPU, C++ on CPU) apply the window themselves."""
    kernel = kernel_runs_on(like.device) or cpu_kernel_runs_on(like)
    masks = None if kernel else band_masks(groups, half_window, like.device)
    return SlidingWindow(half_window, masks)


def kernel_runs_on(device: torch.device, head_dim: int = KERNEL_MAX_HEAD_DIM) -> bool:
    return device.type == "cuda" and head_dim <= KERNEL_MAX_HEAD_DIM and _varlen_kernel() is not None


def cpu_kernel_runs_on(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype == torch.float32 and cpu_ops.cpu_kernels_available()


def cpu_kernel_runs_widened(x: torch.Tensor) -> bool:
    """A bf16 tensor on CPU that the fp32 kernel takes once widened (see the NOTE above)."""
    return x.device.type == "cpu" and x.dtype == torch.bfloat16 and cpu_ops.cpu_kernels_available()


def _varlen_kernel() -> ModuleType | None:
    try:        # Triton only where a GPU runs it
        from engine.kernels import varlen_attention
    except ImportError:
        return None
    return varlen_attention


def varlen_attention(qkv: torch.Tensor, groups: tuple[AttentionGroup, ...], num_heads: int,
                     cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """qkv: [num_tokens, 3 * hidden] (q | k | v, heads inside each) -> [num_tokens, hidden].

    Bidirectional: a token attends to every token of its own text and to nothing else.
    cu_seqlens: the batch's (PackedBatch.cu_seqlens, on qkv's device) for the GPU kernel;
    built from the groups if not given.
    """
    num_tokens, width = qkv.shape
    hidden = width // 3
    head_dim = hidden // num_heads
    if kernel_runs_on(qkv.device, head_dim):
        q, k, v = qkv.view(num_tokens, 3, num_heads, head_dim).unbind(1)
        return _attend_on_kernel(q, k, v, groups, cu_seqlens, None, False).view(num_tokens, hidden)
    if cpu_kernel_runs_on(qkv):
        q, k, v = qkv.view(num_tokens, 3, num_heads, head_dim).unbind(1)
        return _attend_on_cpu_kernel(q, k, v, groups, cu_seqlens, None, False).view(num_tokens, hidden)
    if cpu_kernel_runs_widened(qkv):
        return varlen_attention(qkv.float(), groups, num_heads, cu_seqlens).to(qkv.dtype)
    out = qkv.new_empty(num_tokens, hidden)
    for group in groups:
        end = group.start + group.num_tokens
        # [num_seqs, seq_len, 3, heads, head_dim] -> 3 x [num_seqs, heads, seq_len, head_dim]
        # Each group is a view of the flat tensor, so no mask and no padding: SDPA's fused
        # CPU kernel takes the strided views as they are.
        q, k, v = qkv[group.start:end].view(group.num_seqs, group.seq_len, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v)
        out[group.start:end].view(group.num_seqs, group.seq_len, num_heads, head_dim).copy_(attended.transpose(1, 2))
    return out


def attend_one_row_per_text(qkv: torch.Tensor, groups: tuple[AttentionGroup, ...], num_heads: int,
                            rows: torch.Tensor) -> torch.Tensor:
    """varlen_attention's output [num_seqs, hidden] for one query token per text: rows
    [num_seqs] their flat indices, text by text, each attending over every token of its
    own text (bidirectional). SDPA per group with a one-row query, on every device: it is
    the last layer of a head that pools one token, a sliver of the forward."""
    num_tokens, width = qkv.shape
    hidden = width // 3
    head_dim = hidden // num_heads
    queries = qkv[rows, :hidden].view(-1, num_heads, 1, head_dim)     # [num_seqs, heads, 1, head_dim]
    out = qkv.new_empty(len(rows), num_heads, head_dim)
    first_text = 0
    for group in groups:
        texts = slice(first_text, first_text + group.num_seqs)
        # [num_seqs, seq_len, 3, heads, head_dim] -> k, v [num_seqs, heads, seq_len, head_dim], views
        _, k, v = qkv[group.start:group.start + group.num_tokens].view(
            group.num_seqs, group.seq_len, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4)
        out[texts] = F.scaled_dot_product_attention(queries[texts], k, v).squeeze(2)
        first_text += group.num_seqs
    return out.view(len(rows), hidden)


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: tuple[AttentionGroup, ...],
                     window: SlidingWindow | None = None, is_causal: bool = False,
                     cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """q [num_tokens, num_heads, head_dim], k/v [num_tokens, num_kv_heads, head_dim] -> like q.

    The unfused twin of varlen_attention, for models that rotate q and k first. Each
    text attends only to itself; within it, `is_causal` (decoders) limits a token to
    those before it, and `window` to a band (ModernBERT's local layers). Fewer kv heads
    than query heads is grouped-query attention.
    """
    if kernel_runs_on(q.device, q.shape[-1]):
        return _attend_on_kernel(q, k, v, groups, cu_seqlens, window, is_causal)
    if cpu_kernel_runs_on(q) and _rows_contiguous(q, k, v):
        return _attend_on_cpu_kernel(q, k, v, groups, cu_seqlens, window, is_causal)
    return attend_per_group(q, k, v, groups, window, is_causal)


def attend_per_group(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: tuple[AttentionGroup, ...],
                     window: SlidingWindow | None = None, is_causal: bool = False) -> torch.Tensor:
    """packed_attention's SDPA path (CPU; CUDA without the kernel): one call per group."""
    masks = None
    if window is not None:
        masks = window.masks if window.masks is not None else band_masks(groups, window.half_window, q.device)
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


def attend_after_prefix(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: tuple[AttentionGroup, ...],
                        prefix_keys: torch.Tensor, prefix_values: torch.Tensor) -> torch.Tensor:
    """Causal attention for texts behind a shared prefix (engine.embed.batching.SharedPrefix):
    q [num_tokens, num_heads, head_dim], k/v [num_tokens, num_kv_heads, head_dim] for the
    texts' own tokens; prefix_keys/values [num_prefix_tokens, num_kv_heads, head_dim].
    Each token sees every prefix token, then its own text's up to itself:

        keys          | p p p p | a0 a1 a2 |
        query a1 mask | T T T T | T  T  F  |

    SDPA per group with that mask, on every device: neither the CPU kernel nor the Triton
    one takes a prefix, so the fused paths are not used here.
    """
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    num_prefix_tokens = prefix_keys.shape[0]
    prefix_k, prefix_v = prefix_keys.transpose(0, 1), prefix_values.transpose(0, 1)   # [kv_heads, P, head_dim]
    masks: dict[int, torch.Tensor] = {}
    out = torch.empty_like(q)
    for group in groups:
        rows = slice(group.start, group.start + group.num_tokens)
        shape = (group.num_seqs, group.seq_len)
        qg, kg, vg = (x[rows].unflatten(0, shape).transpose(1, 2) for x in (q, k, v))
        kg = torch.cat([prefix_k.expand(group.num_seqs, -1, -1, -1), kg], dim=2)     # [seqs, kv_heads, P + L, d]
        vg = torch.cat([prefix_v.expand(group.num_seqs, -1, -1, -1), vg], dim=2)
        if group.seq_len not in masks:
            masks[group.seq_len] = prefix_causal_mask(num_prefix_tokens, group.seq_len, q.device)
        attended = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=masks[group.seq_len],
                                                  enable_gqa=num_kv_heads != num_heads)
        out[rows].unflatten(0, shape).copy_(attended.transpose(1, 2))
    return out


def prefix_causal_mask(num_prefix_tokens: int, seq_len: int, device: torch.device) -> torch.Tensor:
    """bool [seq_len, num_prefix_tokens + seq_len]: all of the prefix, then lower-triangular."""
    mask = torch.ones(seq_len, num_prefix_tokens + seq_len, dtype=torch.bool, device=device)
    mask[:, num_prefix_tokens:].tril_()
    return mask


def _attend_on_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: tuple[AttentionGroup, ...],
                      cu_seqlens: torch.Tensor | None, window: SlidingWindow | None, is_causal: bool) -> torch.Tensor:
    """The whole packed batch in one Triton call (its device's; the tests run it interpreted on CPU)."""
    if cu_seqlens is None:
        cu_seqlens = groups_cu_seqlens(groups).to(q.device)
    max_seqlen = max((group.seq_len for group in groups), default=0)
    return _varlen_kernel().varlen_attention(q, k, v, cu_seqlens, max_seqlen, causal=is_causal,
                                             half_window=window.half_window if window is not None else None)


def _attend_on_cpu_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: tuple[AttentionGroup, ...],
                          cu_seqlens: torch.Tensor | None, window: SlidingWindow | None,
                          is_causal: bool) -> torch.Tensor:
    """The whole packed batch in one call of the compiled CPU kernel."""
    if cu_seqlens is None:
        cu_seqlens = groups_cu_seqlens(groups)
    return cpu_ops.varlen_attention(q, k, v, cu_seqlens, q.shape[-1] ** -0.5, is_causal,
                                    window.half_window if window is not None else None)


def _rows_contiguous(*tensors: torch.Tensor) -> bool:
    """Each [num_tokens, heads, head_dim] with heads and head_dim packed within a row, as the CPU kernel reads them."""
    return all(x.stride(2) == 1 and (x.shape[1] == 1 or x.stride(1) == x.shape[2]) for x in tensors)


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
