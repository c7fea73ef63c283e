"""Pooling: per-token hidden states of a packed batch -> one vector per text, as
sentence-transformers does."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def first_rows(seq_lens: torch.Tensor) -> torch.Tensor:
    """[num_seqs] the flat index of each packed text's first token (its [CLS])."""
    return torch.cumsum(seq_lens, 0) - seq_lens


def pool(hidden: torch.Tensor, seq_lens: torch.Tensor, mode: str) -> torch.Tensor:
    """hidden: [num_tokens, dim], texts end to end; seq_lens: [num_seqs], each ≥ 1.

    Returns [num_seqs, dim] in float32. No token of one text reaches another's vector.
    """
    hidden = hidden.float()
    ends = torch.cumsum(seq_lens, 0)                               # [num_seqs]
    if mode == "cls":
        return hidden[ends - seq_lens]
    if mode == "lasttoken":
        return hidden[ends - 1]
    if mode == "max":
        return torch.segment_reduce(hidden, "max", lengths=seq_lens)
    if mode not in ("mean", "mean_sqrt_len_tokens"):
        raise ValueError(f"unsupported pooling mode {mode!r}")
    summed = torch.segment_reduce(hidden, "sum", lengths=seq_lens)
    num_tokens = seq_lens.to(summed.dtype).unsqueeze(-1)           # [num_seqs, 1]
    return summed / (num_tokens if mode == "mean" else num_tokens.sqrt())


def pool_after_prefix(hidden: torch.Tensor, seq_lens: torch.Tensor, mode: str,
                      prefix_hidden: torch.Tensor) -> torch.Tensor:
    """As pool, for texts behind a shared prefix: hidden and seq_lens cover each text's own
    tokens, prefix_hidden [num_prefix_tokens, dim] the tokens every text starts with, which
    pool with each text as sentence-transformers' include_prompt=True has it."""
    if mode == "lasttoken":
        return pool(hidden, seq_lens, mode)
    prefix_hidden = prefix_hidden.float()
    if mode == "cls":
        return prefix_hidden[:1].expand(seq_lens.shape[0], -1)
    if mode == "max":
        return torch.maximum(pool(hidden, seq_lens, mode), prefix_hidden.max(0).values)
    if mode not in ("mean", "mean_sqrt_len_tokens"):
        raise ValueError(f"unsupported pooling mode {mode!r}")
    summed = torch.segment_reduce(hidden.float(), "sum", lengths=seq_lens) + prefix_hidden.sum(0)
    num_tokens = (seq_lens + prefix_hidden.shape[0]).to(summed.dtype).unsqueeze(-1)
    return summed / (num_tokens if mode == "mean" else num_tokens.sqrt())


def finish(pooled: torch.Tensor, dimensions: int | None, normalize: bool) -> torch.Tensor:
    """Matryoshka truncation to `dimensions`, then L2 normalisation when asked."""
    if dimensions is not None:
        pooled = pooled[:, :dimensions]
    return F.normalize(pooled, p=2, dim=-1) if normalize else pooled
