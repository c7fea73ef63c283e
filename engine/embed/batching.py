"""Packed batches for encoders: pure decisions, table-tested in tests/unit/engine.

NOTE: there is no padding anywhere in the embed path. A batch is its texts' tokens
laid end to end (`input_ids` [num_tokens]); every linear layer, norm and activation
runs on that flat tensor, so a short text never pays for a long neighbour. Only
attention needs to know where one text ends: texts are sorted by length, so a batch
is a few runs of texts of equal length, and each run is one dense attention call
over a [num_seqs, seq_len] view of the flat tensor (`AttentionGroup`):

    input_ids  | a a a | b b b | c c c c c | d d d d d | e e e e e e e |
    groups     |  (0, 2 seqs, len 3)  |  (6, 2 seqs, len 5)  | (16, 1, 7) |
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class AttentionGroup:
    """A run of consecutive texts of one length inside a packed batch."""

    start: int          # offset of its first token in the flat batch
    num_seqs: int       # texts in the run
    seq_len: int        # tokens per text

    @property
    def num_tokens(self) -> int:
        return self.num_seqs * self.seq_len


@dataclass(frozen=True)
class PackedBatch:
    """Texts of one forward pass, laid end to end (shapes in comments)."""

    rows: list[int]                     # [num_seqs] caller's row index of each text, in packed order
    input_ids: torch.Tensor             # [num_tokens] int64, texts end to end
    positions: torch.Tensor             # [num_tokens] int64, 0-based position inside its text
    seq_lens: torch.Tensor              # [num_seqs] int64
    groups: tuple[AttentionGroup, ...]  # runs of equal length, covering input_ids in order
    cu_seqlens: torch.Tensor            # [num_seqs + 1] int32, text s is input_ids[cu[s]:cu[s + 1]] (GPU kernel)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device, non_blocking: bool = False) -> "PackedBatch":
        """non_blocking: an asynchronous copy to a GPU, which pinned tensors (pin()) make truly so."""
        return replace(self, input_ids=self.input_ids.to(device, non_blocking=non_blocking),
                       positions=self.positions.to(device, non_blocking=non_blocking),
                       seq_lens=self.seq_lens.to(device, non_blocking=non_blocking),
                       cu_seqlens=self.cu_seqlens.to(device, non_blocking=non_blocking))

    def pin(self) -> "PackedBatch":
        """The same batch in page-locked host memory (torch's caching host allocator reuses the blocks)."""
        return replace(self, input_ids=self.input_ids.pin_memory(), positions=self.positions.pin_memory(),
                       seq_lens=self.seq_lens.pin_memory(), cu_seqlens=self.cu_seqlens.pin_memory())


def plan_batches(lengths: list[int], max_batch_tokens: int) -> list[list[int]]:
    """Group row indices into batches of at most `max_batch_tokens` real tokens.

    Rows are taken shortest first, so a batch holds rows of similar length (few
    attention groups). A row longer than the whole budget still gets a batch of its own.
    """
    if max_batch_tokens < 1:
        raise ValueError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    batch_tokens = 0
    for index in order:
        if batches and batch_tokens + lengths[index] <= max_batch_tokens:
            batches[-1].append(index)
            batch_tokens += lengths[index]
        else:
            batches.append([index])
            batch_tokens = lengths[index]
    return batches


def attention_groups(seq_lens: list[int]) -> tuple[AttentionGroup, ...]:
    """Runs of equal length in `seq_lens` (already sorted, or not: runs are runs)."""
    groups: list[AttentionGroup] = []
    start = 0
    for seq_len in seq_lens:
        last = groups[-1] if groups else None
        if last is not None and last.seq_len == seq_len:
            groups[-1] = AttentionGroup(last.start, last.num_seqs + 1, seq_len)
        else:
            groups.append(AttentionGroup(start, 1, seq_len))
        start += seq_len
    return tuple(groups)


def cu_seqlens(groups: tuple[AttentionGroup, ...]) -> torch.Tensor:
    """int32 [num_seqs + 1]: where each text of the groups starts, then where the last ends."""
    starts = [group.start + index * group.seq_len for group in groups for index in range(group.num_seqs)]
    end = groups[-1].start + groups[-1].num_tokens if groups else 0
    return torch.tensor([*starts, end], dtype=torch.int32)


def pack(token_ids: list[list[int]], rows: list[int]) -> PackedBatch:
    """The PackedBatch of token_ids[row] for each row, in the order given."""
    seq_lens = [len(token_ids[row]) for row in rows]
    lens = torch.tensor(seq_lens, dtype=torch.long)
    flat = torch.tensor([token for row in rows for token in token_ids[row]], dtype=torch.long)
    starts = torch.cumsum(lens, 0) - lens
    positions = torch.arange(flat.shape[0]) - torch.repeat_interleave(starts, lens)
    groups = attention_groups(seq_lens)
    return PackedBatch(rows=list(rows), input_ids=flat, positions=positions, seq_lens=lens, groups=groups,
                       cu_seqlens=cu_seqlens(groups))
