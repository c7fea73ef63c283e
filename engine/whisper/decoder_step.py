"""DecoderStep: one decoder token for each running slot; eager on CPU, from static
buffers per slot-count bucket on CUDA, each bucket's step captured as a CUDA graph.

    eager   tokens, positions -> TextDecoder.step over slots 0..n-1, self-attention over
            positions 0..max position (the CPU path: its exact results and speed)
    static  tokens, positions copied into the bucket's buffers (the smallest bucket >= n;
            the pad slots feed token 0 at position 0) -> TextDecoder.step over the bucket's
            slots, self-attention over all n_text_ctx positions, masked -> logits[:n];
            with graphs the bucket's step is captured on first use, then replayed

NOTE (issue 23, the fp16 slowdown on CUDA): the eager step's self-attention has a new
shape every step, keys [n, heads, max position + 1, head_dim] with a boolean mask. In fp16
and bf16 (never fp32), torch 2.11 on sm90+ hands a masked SDPA to cuDNN first, and cuDNN
builds an execution plan for every shape it has not seen, tens of milliseconds each: every
fp16 step paid one, so one 8-s clip took 30 s where fp32 took a fraction of a second, and
a second clip in the same process was faster only where it met shapes already planned.
The static step has one shape per bucket, and `attention_backends` keeps cuDNN out of the
transcriber's SDPA on CUDA (one query token, the encoder's fixed 1500 keys, and the
alignment pass's per-batch lengths all have kernels that need no plan).

The pad slots of a bucket are free slots: each writes K/V at position 0 of its own slot,
which a request admitted there overwrites at its first step before reading it, and their
logits are dropped. A replay writes the same K/V rows as the step it replays, so the warm-up
and capture runs (on the real inputs) leave the cache as one step would.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from engine.whisper.kv_cache import DecoderCache
from engine.whisper.model import Whisper

NO_CUDNN_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
NUM_WARMUP_RUNS = 2      # before a capture, on a side stream (cuBLAS workspaces, lazy inits)


def attention_backends(device: torch.device):
    """The SDPA backends the transcriber runs under: every backend but cuDNN on CUDA (see
    the NOTE above); on other devices, torch's own choice."""
    return sdpa_kernel(NO_CUDNN_BACKENDS) if device.type == "cuda" else contextlib.nullcontext()


def slot_buckets(max_slots: int) -> tuple[int, ...]:
    """Powers of two below max_slots, then max_slots: 64 -> (1, 2, 4, ..., 64)."""
    buckets, size = [], 1
    while size < max_slots:
        buckets.append(size)
        size *= 2
    return (*buckets, max_slots)


@dataclass(eq=False)
class StepBuffers:
    """One bucket's static inputs and outputs; a captured graph reads and writes these."""

    tokens: torch.Tensor                        # [bucket] long
    positions: torch.Tensor                     # [bucket] long
    logits: torch.Tensor | None = None          # [bucket, n_vocab] float32, once run
    graph: "torch.cuda.CUDAGraph | None" = None


class DecoderStep:
    def __init__(self, model: Whisper, cache: DecoderCache, is_static: bool, use_graphs: bool):
        if use_graphs and not is_static:
            raise ValueError("CUDA graphs replay static buffers: use_graphs needs is_static")
        self.model, self.cache = model, cache
        self.is_static, self.use_graphs = is_static, use_graphs
        self.device = cache.self_k.device
        self.buckets = slot_buckets(cache.max_slots)
        self._buffers: dict[int, StepBuffers] = {}
        self._pool = None          # the graphs' shared memory pool

    @classmethod
    def for_device(cls, model: Whisper, cache: DecoderCache, use_graphs: bool | None = None) -> "DecoderStep":
        """CUDA: static buckets, captured as graphs unless use_graphs=False; CPU: eager."""
        on_cuda = cache.self_k.device.type == "cuda"
        return cls(model, cache, is_static=on_cuda, use_graphs=on_cuda if use_graphs is None else use_graphs)

    @property
    def num_graphs(self) -> int:
        return sum(buffers.graph is not None for buffers in self._buffers.values())

    def __call__(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        """Slot s feeds tokens[s] at positions[s] -> logits [n, n_vocab] float32."""
        if not self.is_static:
            return self.model.decoder.step(torch.tensor(tokens, device=self.device),
                                           torch.tensor(positions, device=self.device), self.cache)
        buffers = self._fill(tokens, positions)
        if not self.use_graphs:
            buffers.logits = self._run(buffers)
        elif buffers.graph is None:
            self._capture_or_run_eagerly(buffers)
        else:
            buffers.graph.replay()
        # A copy: the next replay overwrites the buffer the caller may still hold.
        return buffers.logits[:len(tokens)].clone()

    def _fill(self, tokens: list[int], positions: list[int]) -> StepBuffers:
        num_slots = len(tokens)
        bucket = next(size for size in self.buckets if size >= num_slots)
        buffers = self._buffers.get(bucket)
        if buffers is None:
            buffers = StepBuffers(torch.zeros(bucket, dtype=torch.long, device=self.device),
                                  torch.zeros(bucket, dtype=torch.long, device=self.device))
            self._buffers[bucket] = buffers
        pad = bucket - num_slots
        host = torch.tensor([tokens + [0] * pad, positions + [0] * pad], dtype=torch.long)
        buffers.tokens.copy_(host[0], non_blocking=True)
        buffers.positions.copy_(host[1], non_blocking=True)
        return buffers

    def _run(self, buffers: StepBuffers) -> torch.Tensor:
        with attention_backends(self.device):
            return self.model.decoder.step(buffers.tokens, buffers.positions, self.cache,
                                           length=self.model.config.n_text_ctx)

    def _capture_or_run_eagerly(self, buffers: StepBuffers) -> None:
        """A model that cannot be captured (a host sync in a layer) runs its static steps
        eagerly from then on, with a warning, rather than failing the job."""
        try:
            with torch.cuda.device(self.device):        # the graph and its pool on the cache's device
                self._capture(buffers)
        except RuntimeError as exc:
            warnings.warn(f"Whisper decoder step not captured as a CUDA graph, running it eagerly: {exc}")
            self.use_graphs = False
            buffers.graph = None
            buffers.logits = self._run(buffers)

    def _capture(self, buffers: StepBuffers) -> None:
        """Warm up on a side stream, capture into the shared pool, replay once for this step."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(NUM_WARMUP_RUNS):
                self._run(buffers)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            buffers.logits = self._run(buffers)
        self._pool = graph.pool()
        buffers.graph = graph
        graph.replay()
