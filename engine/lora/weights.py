"""The slots' LoRA weights for one base linear, and the grouped shrink/expand over a step.

One base linear carries one or more projections side by side in its output columns:

    qkv_proj output:   [ q: 0 .. q_size | k: .. + kv_size | v: .. + kv_size ]
    gate_up_proj:      [ gate: 0 .. intermediate | up: .. 2 * intermediate ]
    o_proj, down_proj: one projection each

so a slot holds, per linear, the A of its projections stacked (one shrink for all of
them) and a B per projection (one expand each, into that projection's columns).

The layout is decided once, by device (gpt-fast's rule: decide at load, not per call):

- TorchLoraWeights (CPU): stacked [max_loras, ...] tensors at max_lora_rank. A step whose
  slots have a similar number of tokens (decodes) runs two bmm over all its slots at once,
  each slot's tokens gathered and padded to the largest group; a skewed one (a long prompt
  chunk beside a few decodes) runs two matmuls per slot over its rows (a slice when they
  are one run), nothing for a slot whose adapter leaves the linear alone. Measured on a
  16-row decode step of SmolLM2 with 8 rank-16 adapters (1 thread, AMD EPYC): the per-slot
  loop alone took 1.75x the base step; see the design notes for the batched figure.
- KernelLoraWeights (CUDA): stacked [max_loras, ...] tensors padded to the table's rank, for
  the Triton kernels (engine/lora/triton_ops.py), one shrink and one expand per projection
  for all slots at once.

Both add (t @ B^T) * scaling, t = x @ A^T, to the base output, PEFT's order of operations.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.lora.adapter import LoraAdapter
from engine.lora.batch import LoraBatch, PaddedSlots


@dataclass(frozen=True)
class Projection:
    name: str               # PEFT's module name: "q_proj", ...
    col_start: int          # its columns in the base linear's output
    col_end: int
    in_features: int


class TorchLoraWeights:
    """Per linear, every slot's A stacked (one shrink for all sub-projections) and a B^T per
    sub-projection (one expand each, into its columns):

        a     [max_loras, n_sub * R, in]     sub-projection i's A in rows i*R .. i*R + r
        b[i]  [max_loras, R, out_i]          its B^T in rows 0 .. r

    NOTE: one block-diagonal B for all sub-projections would save two calls per linear but
    read n_sub x the bytes, and a decode step's expand is mostly a read of B. On the loaded
    2-core EPYC the two measured alike (16 rows, 8 rank-16 slots: 0.39-0.47 ms of LoRA work
    per layer beside 1.2-1.3 ms for the base linears), so the smaller read is kept."""

    def __init__(self, projections: list[Projection], num_slots: int, rank: int, dtype: torch.dtype):
        self.projections, self.rank = projections, rank
        self.a = torch.zeros(num_slots, len(projections) * rank, projections[0].in_features, dtype=dtype)
        self.b = [torch.zeros(num_slots, rank, p.col_end - p.col_start, dtype=dtype) for p in projections]
        self.scaling = [0.0] * num_slots
        self.is_used = [False] * num_slots      # the slot's adapter touches this linear

    def load(self, slot: int, adapter: LoraAdapter, layer: int) -> None:
        self.a[slot].zero_()
        self.is_used[slot], self.scaling[slot] = False, adapter.config.scaling
        for index, projection in enumerate(self.projections):
            self.b[index][slot].zero_()
            pair = adapter.weights.get((layer, projection.name))
            if pair is not None:
                a, b = pair
                self.a[slot, index * self.rank:index * self.rank + a.shape[0]] = a
                self.b[index][slot, :b.shape[1]] = b.T
                self.is_used[slot] = True

    def add_to(self, y: torch.Tensor, x: torch.Tensor, batch: LoraBatch) -> None:
        if batch.padded is not None:
            self._add_batched(y, x, batch.padded)
            return
        for slot, rows in batch.segments:
            if not self.is_used[slot]:
                continue
            t = F.linear(x[rows], self.a[slot])
            for index, projection in enumerate(self.projections):
                t_sub, b, cols = t[:, index * self.rank:(index + 1) * self.rank], self.b[index][slot], \
                    slice(projection.col_start, projection.col_end)
                if isinstance(rows, slice):     # y + (t B^T) * scaling: sgemm's alpha, beta = 1
                    y[rows, cols].addmm_(t_sub, b, alpha=self.scaling[slot])
                else:
                    y[:, cols].index_add_(0, rows, t_sub @ b, alpha=self.scaling[slot])

    def _add_batched(self, y: torch.Tensor, x: torch.Tensor, padded: PaddedSlots) -> None:
        """bmm over the slots' token groups, padded to the largest (decode steps: a few rows each)."""
        num_slots = padded.slots.stop - padded.slots.start
        grouped = x.index_select(0, padded.rows).view(num_slots, -1, x.shape[1])
        t = torch.bmm(grouped, self.a[padded.slots].transpose(1, 2))
        deltas = [torch.bmm(t[:, :, index * self.rank:(index + 1) * self.rank], b[padded.slots])
                  for index, b in enumerate(self.b)]
        delta = deltas[0] if len(deltas) == 1 else torch.cat(deltas, dim=2)
        y.index_add_(0, padded.rows, (delta * padded.scales).view(-1, y.shape[1]))


class KernelLoraWeights:
    def __init__(self, projections: list[Projection], num_slots: int, rank: int, dtype: torch.dtype,
                 device: torch.device):
        """rank: the table's padded rank, a power of two >= 16."""
        self.projections, self.rank = projections, rank
        in_features = projections[0].in_features
        self.a = torch.zeros(num_slots, len(projections) * rank, in_features, dtype=dtype, device=device)
        self.b = [torch.zeros(num_slots, p.col_end - p.col_start, rank, dtype=dtype, device=device)
                  for p in projections]
        self.scaling = torch.zeros(num_slots, dtype=torch.float32, device=device)

    def load(self, slot: int, adapter: LoraAdapter, layer: int) -> None:
        self.a[slot].zero_()
        for index, projection in enumerate(self.projections):
            self.b[index][slot].zero_()
            pair = adapter.weights.get((layer, projection.name))
            if pair is not None:
                a, b = pair
                self.a[slot, index * self.rank:index * self.rank + a.shape[0]].copy_(a, non_blocking=True)
                self.b[index][slot, :, :b.shape[1]].copy_(b, non_blocking=True)
        self.scaling[slot] = adapter.config.scaling

    def add_to(self, y: torch.Tensor, x: torch.Tensor, batch: LoraBatch) -> None:
        from engine.lora import triton_ops     # triton is imported only where it runs
        t = triton_ops.lora_shrink(x, self.a, batch.sorted_rows, batch.slot_starts, batch.num_lora_tokens)
        for index, projection in enumerate(self.projections):
            triton_ops.lora_expand_(y[:, projection.col_start:projection.col_end],
                                    t[:, index * self.rank:(index + 1) * self.rank], self.b[index], self.scaling,
                                    batch.sorted_rows, batch.slot_starts)
