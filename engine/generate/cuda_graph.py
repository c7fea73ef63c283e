"""CudaGraphRunner: decode-only steps replayed from CUDA graphs captured once per batch size.

    step inputs (host lists -> device)   static buffers (max bucket rows)      graph per bucket
    input_ids   [n]          ---copy-->  input_ids   [0:n] | padding [n:b]  -> replay graph[b]
    positions   [n]                      positions         |   0            -> hidden [0:b]
    slot_mapping[n]                      slot_mapping      |   dummy slot      (rows n:b ignored)
    seq_lens    [n]                      seq_lens          |   0
    block_tables[n, w]                   block_tables [0:n, 0:w]   (columns past a seq_len are never read)
                                         query_start_loc = 0, 1, .., b (fixed: one token a row)

NOTE: a step of n decodes runs the graph of the smallest bucket b >= n (1, 2, 4, .., 256,
bounded by max_num_seqs); rows n..b are padding that must change nothing: their K/V go
to the reserved dummy block past the last real one (LLMEngine allocates it) and their
seq_len 0 makes the paged-attention kernel write zeros for them, read nothing. Every
bucket reads the same buffers, so a step of any size reuses them. Graphs are captured
largest first into one memory pool, which the smaller ones share (only one replays at a
time); the bytes the pool took are reported in the engine's settings. Prefill and mixed
steps run eagerly: their token counts vary too much to bucket.

With capture off (on CPU, where there are no CUDA graphs), run() calls the very same
forward on the static buffers, which is how the buffer handling is tested without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.generate.attention import AttentionMetadata, FlatMetadata
from engine.generate.kv_cache import KVCache

BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

Forward = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata, KVCache], torch.Tensor]


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """The buckets up to max_num_seqs, and max_num_seqs itself when it falls between two
    (a batch never exceeds it, so a larger bucket would only pad)."""
    sizes = [size for size in BATCH_SIZE_BUCKETS if size <= max_num_seqs]
    if max_num_seqs < BATCH_SIZE_BUCKETS[-1] and max_num_seqs not in sizes:
        sizes.append(max_num_seqs)
    return sizes


class CudaGraphRunner:
    def __init__(self, forward: Forward, kv_cache: KVCache, max_num_seqs: int, max_num_blocks_per_seq: int, padding_slot: int, device: torch.device,
                 capture: bool):
        self.forward, self.kv_cache, self.device = forward, kv_cache, device
        self.batch_sizes = graph_batch_sizes(max_num_seqs)
        self.padding_slot = padding_slot        # a slot of the dummy block: padding rows write their K/V there
        self.is_capturing = capture and device.type == "cuda"
        rows = self.batch_sizes[-1]
        self.input_ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((rows,), padding_slot, dtype=torch.long, device=device)
        self.seq_lens = torch.zeros(rows, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(rows, max_num_blocks_per_seq, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(rows + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}      # bucket -> the hidden states its graph writes
        self.memory_bytes = 0                            # device memory the captured graphs hold
        self.num_runs = 0                                # decode steps that went through the buffers

    def can_run(self, flat: FlatMetadata) -> bool:
        """A decode-only batch fits: no more sequences than the largest bucket, no wider block table."""
        num_seqs, width = flat.block_tables.shape
        return num_seqs <= self.batch_sizes[-1] and width <= self.block_tables.shape[1]

    def bucket_for(self, num_seqs: int) -> int:
        return next(size for size in self.batch_sizes if size >= num_seqs)

    @torch.inference_mode()
    def capture_all(self) -> None:
        """Capture every bucket, largest first, into one pool; measure what it took."""
        if not self.is_capturing:
            return
        torch.cuda.synchronize(self.device)
        free_before, _ = torch.cuda.mem_get_info(self.device)
        pool = None
        for size in reversed(self.batch_sizes):
            self._pad_from(0, size)
            self._forward(size)                 # warm up: Triton compiles, cuBLAS picks its kernels
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self._forward(size)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize(self.device)
        free_after, _ = torch.cuda.mem_get_info(self.device)
        self.memory_bytes = max(0, free_before - free_after)

    def run(self, batch) -> torch.Tensor:
        """batch: a decode-only ForwardBatch (engine/generate/runner.py) -> hidden [num_seqs, hidden_size]."""
        num_seqs = batch.input_ids.shape[0]
        size = self.bucket_for(num_seqs)
        flat = batch.meta.flat
        self.input_ids[:num_seqs].copy_(batch.input_ids, non_blocking=True)
        self.positions[:num_seqs].copy_(batch.positions, non_blocking=True)
        self.slot_mapping[:num_seqs].copy_(batch.meta.slot_mapping, non_blocking=True)
        self.seq_lens[:num_seqs].copy_(flat.seq_lens, non_blocking=True)
        self.block_tables[:num_seqs, :flat.block_tables.shape[1]].copy_(flat.block_tables, non_blocking=True)
        self._pad_from(num_seqs, size)
        self.num_runs += 1
        if self.is_capturing:
            self.graphs[size].replay()
            return self.outputs[size][:num_seqs]
        return self._forward(size)[:num_seqs]

    def _pad_from(self, num_seqs: int, size: int) -> None:
        """Rows num_seqs..size: a token at position 0 with no context, its K/V to the dummy slot."""
        if num_seqs == size:
            return
        self.input_ids[num_seqs:size].zero_()
        self.positions[num_seqs:size].zero_()
        self.slot_mapping[num_seqs:size].fill_(self.padding_slot)
        self.seq_lens[num_seqs:size].zero_()

    def _forward(self, size: int) -> torch.Tensor:
        meta = AttentionMetadata(self.slot_mapping[:size], [], [],
                                 FlatMetadata(self.query_start_loc[:size + 1], self.seq_lens[:size],
                                              self.block_tables[:size], max_query_len=1))
        return self.forward(self.input_ids[:size], self.positions[:size], meta, self.kv_cache)
