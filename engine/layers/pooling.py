"""Pooling: per-token hidden states of a packed batch -> one vector per text, as
sentence-transformers does."""

from __future__ import annotations

import torch
import torch.nn.functional as F


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


def finish(pooled: torch.Tensor, dimensions: int | None, normalize: bool) -> torch.Tensor:
    """Matryoshka truncation to `dimensions`, then L2 normalisation when asked."""
    if dimensions is not None:
        pooled = pooled[:, :dimensions]
    return F.normalize(pooled, p=2, dim=-1) if normalize else pooled
