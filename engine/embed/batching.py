"""Packed batches for encoders: pure decisions, table-tested in tests/unit/engine.

NOTE: there is no padding anywhere in the embed path. A batch is its texts' tokens
laid end to end (`input_ids` [num_tokens]); every linear layer, norm and activation
runs on that flat tensor, so a short text never pays for a long neighbour. Only
attention needs to know where one text ends: texts are sorted by length, so a batch
is a few runs of texts of equal length, and each run is one dense attention call
over a [num_seqs, seq_len] view of the flat tensor (`AttentionGroup`):

    input_ids  | a a a | b b b | c c c c c | d d d d d | e e e e e e e |
    groups     |  (0, 2 seqs, len 3)  |  (6, 2 seqs, len 5)  | (16, 1, 7) |

A causal model (an LLM embedder) may run the tokens every text starts with (an
instruction prompt) once, as a SharedPrefix: under causal attention their states do not
depend on what follows them. The batch then holds only each text's own tokens, at
positions after the prefix, and each text attends to the prefix whole, then to itself:

    prefix     | p p p p |                     run once, keys and values kept per layer
    input_ids  | a a | b b | c c c |           positions 4, 5, ...
    a attends  | p p p p | a a (causal) |
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from engine.token_ids import common_prefix


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
class SharedPrefix:
    """Tokens every text of a batch starts with, run once through a causal model (the
    model's encode_prefix). Its first n tokens' states are those of n tokens alone, so a
    shorter shared prefix is a slice of a longer one (first)."""

    token_ids: tuple[int, ...]          # [num_tokens]
    keys: tuple[torch.Tensor, ...]      # per layer [num_tokens, num_kv_heads, head_dim], rotated as attended
    values: tuple[torch.Tensor, ...]    # per layer [num_tokens, num_kv_heads, head_dim]
    hidden: torch.Tensor                # [num_tokens, hidden_size] after the final norm (pooled by mean, max, cls)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def first(self, num_tokens: int) -> "SharedPrefix":
        if num_tokens == self.num_tokens:
            return self
        return SharedPrefix(self.token_ids[:num_tokens], tuple(k[:num_tokens] for k in self.keys),
                            tuple(v[:num_tokens] for v in self.values), self.hidden[:num_tokens])


@dataclass(frozen=True)
class PackedBatch:
    """Texts of one forward pass, laid end to end (shapes in comments)."""

    rows: list[int]                     # [num_seqs] caller's row index of each text, in packed order
    input_ids: torch.Tensor             # [num_tokens] int64, texts end to end
    positions: torch.Tensor             # [num_tokens] int64, 0-based position inside its text
    seq_lens: torch.Tensor              # [num_seqs] int64
    groups: tuple[AttentionGroup, ...]  # runs of equal length, covering input_ids in order
    cu_seqlens: torch.Tensor            # [num_seqs + 1] int32, text s is input_ids[cu[s]:cu[s + 1]] (GPU kernel)
    prefix: SharedPrefix | None = None  # tokens before every text, on the model's device; None: texts are whole

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


def pack(token_ids: list[list[int]], rows: list[int], prefix: SharedPrefix | None = None) -> PackedBatch:
    """The PackedBatch of token_ids[row] for each row, in the order given; behind `prefix`
    (token_ids then hold the tokens after it), positions count on from its end."""
    seq_lens = [len(token_ids[row]) for row in rows]
    lens = torch.tensor(seq_lens, dtype=torch.long)
    flat = torch.tensor([token for row in rows for token in token_ids[row]], dtype=torch.long)
    starts = torch.cumsum(lens, 0) - lens
    positions = torch.arange(flat.shape[0]) - torch.repeat_interleave(starts, lens)
    if prefix is not None:
        positions += prefix.num_tokens
    groups = attention_groups(seq_lens)
    return PackedBatch(rows=list(rows), input_ids=flat, positions=positions, seq_lens=lens, groups=groups,
                       cu_seqlens=cu_seqlens(groups), prefix=prefix)


def shared_prefix_length(token_ids: list[list[int]]) -> int:
    """How many leading tokens every row shares, leaving each row at least one of its own
    (the last token, which last-token pooling reads, is never shared). Token ids, not the
    prompt's own tokenization: BPE may merge a prompt's last characters with a text's first."""
    if not token_ids:
        return 0
    first = token_ids[0]
    length = min(len(ids) for ids in token_ids) - 1
    for ids in token_ids[1:]:
        if length <= 0:
            return 0
        if ids[:length] != first[:length]:      # a slice compare is C; the walk only where they differ
            length = common_prefix(first[:length], ids)
    return max(length, 0)
