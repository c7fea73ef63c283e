"""DecoderCache: per-request self- and cross-attention K/V, held in slots.

    self_k, self_v    [n_layer, max_slots, n_text_ctx,  n_state]   grows one row per step
    cross_k, cross_v  [n_layer, max_slots, n_audio_ctx, n_state]   written once, at admission

NOTE: the running requests always occupy slots 0..num_active-1. A request that
finishes gives its slot to the request in the last slot (`move`), so every decode step
works on plain leading slices of these tensors rather than gathering scattered slots;
a move copies one request's rows, a gather would copy every request's on every step.

A beam's hypotheses are rows in slots of their own. The cross K/V is computed once per
chunk and copied into each of its slots (`copy_cross`); when the beam reorders its
hypotheses, their self K/V rows follow them (`reorder`).
"""

from __future__ import annotations

import torch

from engine.whisper.config import WhisperConfig


class DecoderCache:
    def __init__(self, config: WhisperConfig, max_slots: int, dtype: torch.dtype, device: torch.device):
        if max_slots < 1:
            raise ValueError(f"max_slots must be positive, got {max_slots}")
        self.max_slots = max_slots
        layers, state = config.n_text_layer, config.n_text_state
        self_shape = (layers, max_slots, config.n_text_ctx, state)
        cross_shape = (layers, max_slots, config.n_audio_ctx, state)
        self.self_k = torch.zeros(self_shape, dtype=dtype, device=device)
        self.self_v = torch.zeros(self_shape, dtype=dtype, device=device)
        self.cross_k = torch.zeros(cross_shape, dtype=dtype, device=device)
        self.cross_v = torch.zeros(cross_shape, dtype=dtype, device=device)

    def move(self, src: int, dst: int, num_positions: int) -> None:
        """Copy slot `src` (its first num_positions self rows, all cross rows) into `dst`."""
        if src == dst:
            return
        self.self_k[:, dst, :num_positions] = self.self_k[:, src, :num_positions]
        self.self_v[:, dst, :num_positions] = self.self_v[:, src, :num_positions]
        self.cross_k[:, dst] = self.cross_k[:, src]
        self.cross_v[:, dst] = self.cross_v[:, src]

    def copy_cross(self, src: int, dsts: list[int]) -> None:
        """Slot `src`'s cross K/V into the slots `dsts` (a beam's other hypotheses)."""
        for dst in dsts:
            self.cross_k[:, dst] = self.cross_k[:, src]
            self.cross_v[:, dst] = self.cross_v[:, src]

    def reorder(self, dsts: list[int], srcs: list[int], num_positions: int) -> None:
        """Slot dsts[k] takes slot srcs[k]'s first num_positions self rows, all at once
        (the right side is gathered before anything is written, so a permutation is safe)."""
        moves = [(dst, src) for dst, src in zip(dsts, srcs) if dst != src]
        if not moves:
            return
        dst_slots, src_slots = (list(slots) for slots in zip(*moves))
        self.self_k[:, dst_slots, :num_positions] = self.self_k[:, src_slots, :num_positions]
        self.self_v[:, dst_slots, :num_positions] = self.self_v[:, src_slots, :num_positions]
