"""Pooling: per-token hidden states -> one vector per text, as sentence-transformers does."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """hidden: [batch, seq, dim]; attention_mask: [batch, seq], 1 = real token (right padding).

    Returns [batch, dim] in float32. Padded slots never contribute.
    """
    hidden = hidden.float()
    mask = attention_mask.to(hidden.dtype).unsqueeze(-1)          # [batch, seq, 1]
    if mode == "cls":
        return hidden[:, 0]
    if mode == "lasttoken":
        last = attention_mask.sum(dim=1).long() - 1                # [batch]
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    if mode == "max":
        return hidden.masked_fill(mask == 0, float("-inf")).amax(dim=1)
    num_tokens = mask.sum(dim=1).clamp(min=1e-9)                   # [batch, 1]
    summed = (hidden * mask).sum(dim=1)
    if mode == "mean":
        return summed / num_tokens
    if mode == "mean_sqrt_len_tokens":
        return summed / num_tokens.sqrt()
    raise ValueError(f"unsupported pooling mode {mode!r}")


def finish(pooled: torch.Tensor, dimensions: int | None, normalize: bool) -> torch.Tensor:
    """Matryoshka truncation to `dimensions`, then L2 normalisation when asked."""
    if dimensions is not None:
        pooled = pooled[:, :dimensions]
    return F.normalize(pooled, p=2, dim=-1) if normalize else pooled
