"""The slots' LoRA weights for one base linear, and the grouped shrink/expand over a step.

One base linear carries one or more projections side by side in its output columns:

    qkv_proj output:   [ q: 0 .. q_size | k: .. + kv_size | v: .. + kv_size ]
    gate_up_proj:      [ gate: 0 .. intermediate | up: .. 2 * intermediate ]
    o_proj, down_proj: one projection each

so a slot holds, per linear, the A of its projections stacked (one shrink for all of
them) and their B side by side in the linear's output columns.

The layout is decided once, by device (gpt-fast's rule: decide at load, not per call):

- TorchLoraWeights (CPU): stacked [max_loras, ...] tensors at max_lora_rank, B block-diagonal
  over the sub-projections. A step whose slots have a similar number of tokens (decodes)
  runs two bmm over all its slots at once, each slot's tokens gathered and padded to the
  largest group; a skewed one (a long prompt chunk beside a few decodes) runs two matmuls
  per slot over its rows (a slice when they are one run), nothing for a slot whose adapter
  leaves the linear alone. Measured on a 16-row decode step of SmolLM2 with 8 rank-16
  adapters (1 thread, AMD EPYC): the per-slot loop alone took 1.75x the base step; see the
  design notes for the batched figure.
- KernelLoraWeights (CUDA): stacked [max_loras, ...] tensors padded to the table's rank, for
  the Triton kernels (engine/lora/triton_ops.py), one shrink and one expand per projection
  for all slots at once.

Both add B's product with t = x @ A^T, times the adapter's scaling, to the base output: the
kernels scale the product, PEFT's order of operations; the CPU path scales t, the smaller
tensor (the tests' greedy tokens equal PEFT's either way).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.lora.adapter import LoraAdapter
from engine.lora.batch import LoraBatch, PaddedSlots


@dataclass(frozen=True)
class Projection:
    name: str               # PEFT's module name: "q_proj", ...
    col_start: int          # its columns in the base linear's output
    col_end: int
    in_features: int


class TorchLoraWeights:
    """Per linear, every slot's A^T stacked (one shrink for all sub-projections) and its B^T
    block-diagonal over the sub-projections (one expand into all of the linear's columns):

        a_t   [max_loras, in, n_sub * R]      sub-projection i's A^T in columns i*R .. i*R + r
        b     [max_loras, n_sub * R, out]     its B^T in rows i*R .. i*R + r, columns of its
                                              projection; zero elsewhere

    NOTE: a decode step of 128 rows (SmolLM2, 8 rank-16 slots, 16 rows each, 1 thread,
    2-core Intel Xeon with AMX) spent 32 % of the base linears' time in LoRA work with B per
    sub-projection: an expand each, their deltas concatenated, and the scaling applied to the
    [rows, out] deltas. The scaling now goes on t ([rows, n_sub * R]), A is stored transposed
    for the shrink, and the block-diagonal B makes one expand and no concatenation: the four
    linears' LoRA work per layer went from 2.15 to 1.46 ms (/tmp-style micro-benchmark of
    this class's ops, 300 calls each). The zeros cost n_sub x B's bytes (q|k|v: 3x, gate|up:
    2x), which at decode's row counts the one bigger matmul repays."""

    def __init__(self, projections: list[Projection], num_slots: int, rank: int, dtype: torch.dtype):
        self.projections, self.rank = projections, rank
        out_features = projections[-1].col_end
        self.a_t = torch.zeros(num_slots, projections[0].in_features, len(projections) * rank, dtype=dtype)
        self.b = torch.zeros(num_slots, len(projections) * rank, out_features, dtype=dtype)
        self.scaling = [0.0] * num_slots
        self.is_used = [False] * num_slots      # the slot's adapter touches this linear

    def load(self, slot: int, adapter: LoraAdapter, layer: int) -> None:
        self.a_t[slot].zero_()
        self.b[slot].zero_()
        self.is_used[slot], self.scaling[slot] = False, adapter.config.scaling
        for index, projection in enumerate(self.projections):
            pair = adapter.weights.get((layer, projection.name))
            if pair is not None:
                a, b = pair
                rows = slice(index * self.rank, index * self.rank + a.shape[0])
                self.a_t[slot, :, rows] = a.T
                self.b[slot, rows, projection.col_start:projection.col_end] = b.T
                self.is_used[slot] = True

    def add_to(self, y: torch.Tensor, x: torch.Tensor, batch: LoraBatch) -> None:
        if batch.padded is not None:
            self._add_batched(y, x, batch.padded)
            return
        for slot, rows in batch.segments:
            if not self.is_used[slot]:
                continue
            t = x[rows] @ self.a_t[slot]
            if isinstance(rows, slice):     # y + (t B^T) * scaling: sgemm's alpha, beta = 1
                self._expand_blocks(y[rows], t, slot)
            else:
                y.index_add_(0, rows, t @ self.b[slot], alpha=self.scaling[slot])

    def _expand_blocks(self, out: torch.Tensor, t: torch.Tensor, slot: int) -> None:
        """out += t B^T * scaling, sub-projection by sub-projection: only B's diagonal blocks,
        each into its own columns. For a run of a prompt chunk (hundreds of rows) the
        block-diagonal's zeros cost more than the extra calls: 1.73 against 2.54 ms for q|k|v
        and 2.93 against 4.19 ms for gate|up, 8 runs of 250 rows (1 thread, AMX Xeon)."""
        for index, projection in enumerate(self.projections):
            ranks = slice(index * self.rank, (index + 1) * self.rank)
            columns = slice(projection.col_start, projection.col_end)
            out[:, columns].addmm_(t[:, ranks], self.b[slot, ranks, columns], alpha=self.scaling[slot])

    def _add_batched(self, y: torch.Tensor, x: torch.Tensor, padded: PaddedSlots) -> None:
        """bmm over the slots' token groups, padded to the largest (decode steps: a few rows
        each); the scaling (0 on padding rows) applied to t, the smallest tensor."""
        num_slots = padded.slots.stop - padded.slots.start
        if padded.run is not None and y.is_contiguous():   # no gather, no scatter: views of the run
            t = torch.bmm(x[padded.run].reshape(num_slots, -1, x.shape[1]), self.a_t[padded.slots]).mul_(padded.scales)
            y[padded.run].view(num_slots, -1, y.shape[1]).baddbmm_(t, self.b[padded.slots])
            return
        rows = padded.rows if padded.rows is not None else torch.arange(padded.run.start, padded.run.stop,
                                                                         device=x.device)
        grouped = x.index_select(0, rows).view(num_slots, -1, x.shape[1])
        t = torch.bmm(grouped, self.a_t[padded.slots]).mul_(padded.scales)
        delta = torch.bmm(t, self.b[padded.slots])
        y.index_add_(0, rows, delta.view(-1, y.shape[1]))


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
