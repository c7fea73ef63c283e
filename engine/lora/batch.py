"""LoraBatch: the step's tokens grouped by adapter slot, built once per step and read by
every LoRA linear of every layer.

    token_slots:   [ 2  2 -1  0 | 0  0  1  1 | -1 -1 ]     -1 = the base model: no LoRA work
    segments:      slot 0 -> rows 3:6 (a slice: one run), slot 1 -> 6:8, slot 2 -> [0 1]
    padded:        slots 0:3, rows [3 4 5 | 6 7 0 | 0 1 0]  each slot's rows padded to the largest
                   group (3) with row 0 at scale 0; scales [s0 s0 s0 | s1 s1 0 | s2 s2 0]
    sorted_rows:   [3 4 5 6 7 0 1]     the rows by slot (the kernels' gather list)
    slot_starts:   [0, 3, 5, 7]        slot s's rows are sorted_rows[slot_starts[s]:slot_starts[s + 1]]

CPU: the runner lays a step's decodes, then its prompt chunks, out slot by slot
(LoraManager.by_slot). A step whose runs of one slot are long (prompt chunks: tens to
hundreds of rows each) goes run by run through `segments`, two matmuls per run on views of
its rows, adding in place. Otherwise a step whose padding would at most double the LoRA
work (decodes: a few rows per slot) goes through `padded`, two bmm per linear for all
slots; when the slots have as many rows each (rows that started together, as a shard's do)
`padded.run` is one slice of the step's rows: the bmm read it as a view and the expand adds
into the output in place. A skewed step (a prompt chunk beside decodes) goes slot by slot.
CUDA: the kernels take `sorted_rows` and `slot_starts`, device tensors whose shapes depend
only on the step's size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Rows = slice | torch.Tensor     # a slot's token rows: a run, or a long index tensor
MAX_PADDING = 2.0               # padded rows / LoRA rows above which the CPU path goes slot by slot
MIN_RUN_ROWS = 64               # LoRA rows per run (on average) from which a step goes run by run on
                                # views of its rows rather than gathered slot by slot


@dataclass
class PaddedSlots:
    slots: slice                # the slots from the lowest to the highest in use (unused ones between: all padding)
    rows: torch.Tensor | None   # long [num_slots * max_rows]: each slot's token rows, padded with row 0;
                                # None when `run` holds them
    scales: torch.Tensor        # [num_slots, max_rows, 1]: the slot's scaling on its rows, 0 on padding
    run: slice | None = None    # set when the slots' rows are one run, slot by slot, as many each: a
                                # [num_slots, rows, features] view of it needs no gather and no scatter


@dataclass
class LoraBatch:
    segments: list[tuple[int, Rows]]    # (slot, token rows of it), no base rows; CPU path only: each slot's rows
                                        # (slots ascending), or each run of one slot's rows (long runs)
    num_lora_tokens: int                # tokens that carry an adapter
    padded: PaddedSlots | None = None   # CPU: set when the step's slots are balanced enough to batch
    sorted_rows: torch.Tensor | None = None     # int32 [num_lora_tokens], on the device: the kernel path only
    slot_starts: torch.Tensor | None = None     # int32 [max_loras + 1], on the device: the kernel path only


def build_lora_batch(token_slots: list[int], slot_scalings: list[float], device: torch.device,
                     dtype: torch.dtype, for_kernels: bool) -> LoraBatch | None:
    """token_slots: each token's slot (-1: the base); slot_scalings: each slot's adapter scaling
    (its length is max_loras). None when no token carries an adapter, so a base-only step
    does no LoRA work at all."""
    rows_of: dict[int, list[int]] = {}
    for row, slot in enumerate(token_slots):
        if slot >= 0:
            rows_of.setdefault(slot, []).append(row)
    if not rows_of:
        return None
    num_lora_tokens = sum(len(rows) for rows in rows_of.values())
    if for_kernels:
        return _kernel_batch(rows_of, num_lora_tokens, len(slot_scalings), device)
    runs = _runs(token_slots)
    if num_lora_tokens >= MIN_RUN_ROWS * len(runs):     # long runs (prompt chunks laid out by slot): views,
        return LoraBatch(runs, num_lora_tokens)         # no gather and no scatter, a slot perhaps twice
    segments = [(slot, _as_rows(rows_of[slot], device)) for slot in sorted(rows_of)]
    return LoraBatch(segments, num_lora_tokens, _padded(rows_of, num_lora_tokens, slot_scalings, device, dtype))


def _padded(rows_of: dict[int, list[int]], num_lora_tokens: int, slot_scalings: list[float],
            device: torch.device, dtype: torch.dtype) -> PaddedSlots | None:
    low, high = min(rows_of), max(rows_of) + 1
    max_rows = max(len(rows) for rows in rows_of.values())
    if (high - low) * max_rows > MAX_PADDING * num_lora_tokens:
        return None
    first = rows_of[low][0]
    if (high - low) * max_rows == num_lora_tokens and all(
            rows_of.get(slot) == list(range(first + (slot - low) * max_rows, first + (slot - low + 1) * max_rows))
            for slot in range(low, high)):
        scales = [slot_scalings[slot] for slot in range(low, high) for _ in range(max_rows)]
        return PaddedSlots(slice(low, high), None,
                           torch.tensor(scales, dtype=dtype, device=device).view(high - low, max_rows, 1),
                           run=slice(first, first + num_lora_tokens))
    rows, scales = [], []
    for slot in range(low, high):
        slot_rows = rows_of.get(slot, [])
        rows += slot_rows + [0] * (max_rows - len(slot_rows))
        scales += [slot_scalings[slot]] * len(slot_rows) + [0.0] * (max_rows - len(slot_rows))
    return PaddedSlots(slice(low, high), torch.tensor(rows, dtype=torch.long, device=device),
                       torch.tensor(scales, dtype=dtype, device=device).view(high - low, max_rows, 1))


def _kernel_batch(rows_of: dict[int, list[int]], num_lora_tokens: int, num_slots: int,
                  device: torch.device) -> LoraBatch:
    sorted_rows = [row for slot in sorted(rows_of) for row in rows_of[slot]]
    starts = [0]
    for slot in range(num_slots):
        starts.append(starts[-1] + len(rows_of.get(slot, ())))
    host = torch.tensor(sorted_rows + starts, dtype=torch.int32)
    if device.type == "cuda":
        host = host.pin_memory()
    on_device = host.to(device, non_blocking=True)
    return LoraBatch([], num_lora_tokens, None, on_device[:num_lora_tokens], on_device[num_lora_tokens:])


def _runs(token_slots: list[int]) -> list[tuple[int, slice]]:
    """(slot, its rows) for each maximal run of tokens of one slot, base runs left out."""
    runs, start = [], 0
    for row in range(1, len(token_slots) + 1):
        if row == len(token_slots) or token_slots[row] != token_slots[start]:
            if token_slots[start] >= 0:
                runs.append((token_slots[start], slice(start, row)))
            start = row
    return runs


def _as_rows(rows: list[int], device: torch.device) -> Rows:
    if rows[-1] - rows[0] + 1 == len(rows):
        return slice(rows[0], rows[-1] + 1)
    return torch.tensor(rows, dtype=torch.long, device=device)
