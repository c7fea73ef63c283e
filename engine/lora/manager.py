"""LoraManager: an engine's adapters — loaded on the host when a request names one, copied
into a device slot when a step needs it, handed to the model as the step's LoraBatch.

    add_request(adapter=src) -> adapter(src): read + checked once, kept in a host LRU
                                             (max_cpu_loras), the request holds it
    step: batch_for(requests) -> SlotTable.assign: resident adapters keep their slot,
                                 others take a free or least recently used one (a copy
                                 into every layer's slot weights, host -> device)
                              -> LoraBatch: each token's slot, grouped (engine/lora/batch.py)

    prefetch(sources)   -> the prefetch thread reads them into the host LRU, nothing else

Loading (file reads, safetensors parsing, checks) happens when a request is queued, not in
a step; a step only copies a resident-on-host adapter into a slot when it is missing. The
generate feed asks for the next wave's adapters while the current wave runs
(engine/lora/waves.py): one background thread reads them into the host cache, so that their
rows, when queued, find them there.

NOTE threads: the host cache (`_host`) and the prefetches in flight (`_prefetching`) are
shared with the prefetch thread and touched only under `_host_lock`, never held during a
read. Slots, the device weights and the step's batch belong to the caller's thread alone.
A prefetch that fails is dropped: its rows read the adapter again when queued, and meet
the error there as their own.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable
from concurrent import futures
from pathlib import Path

import torch
from torch import nn

from engine.generate.model_config import DecoderConfig
from engine.lora.adapter import LoraAdapter, load_adapter
from engine.lora.batch import LoraBatch, build_lora_batch
from engine.lora.linear import LoraWeights, wrap_linears
from engine.lora.options import LoraOptions
from engine.lora.slots import SlotTable
from engine.lora.weights import KernelLoraWeights, Projection, TorchLoraWeights

log = logging.getLogger(__name__)


class LoraManager:
    def __init__(self, options: LoraOptions, config: DecoderConfig, dtype: torch.dtype, device: torch.device,
                 use_kernels: bool):
        """use_kernels: the Triton shrink/expand (CUDA) rather than the per-slot torch matmuls (CPU)."""
        self.options, self.config, self.dtype, self.device = options, config, dtype, device
        self.use_kernels = use_kernels
        self.slot_table = SlotTable(options.max_loras)
        self._host: OrderedDict[str, LoraAdapter] = OrderedDict()   # source -> adapter, least recently used first
        self._prefetching: dict[str, futures.Future] = {}           # source -> its read on the prefetch thread
        self._host_lock = threading.Lock()                           # guards _host, _prefetching, num_prefetched
        self._prefetcher: futures.ThreadPoolExecutor | None = None   # one thread, started by the first prefetch
        self.num_prefetched = 0                                      # adapters the prefetch thread read so far
        self._layers: list[list[LoraWeights]] = []                   # per layer, per linear: its slot weights
        self.num_slot_loads = 0                                      # adapters copied into a slot so far
        self._slot_scalings = [0.0] * options.max_loras              # slot -> its adapter's scaling

    @property
    def padded_rank(self) -> int:
        """The kernels' rank: max_lora_rank rounded up to a power of two, at least tl.dot's 16."""
        return max(16, 1 << (self.options.max_lora_rank - 1).bit_length())

    def wrap(self, model: nn.Module) -> None:
        """Swap the decoder's linears for LoraLinears (once, after the base weights are packed)."""
        self._layers = wrap_linears(model.model.layers, self.config, self._make_weights)

    def _make_weights(self, projections: list[Projection]) -> LoraWeights:
        if self.use_kernels:
            return KernelLoraWeights(projections, self.options.max_loras, self.padded_rank, self.dtype, self.device)
        return TorchLoraWeights(projections, self.options.max_loras, self.options.max_lora_rank, self.dtype)

    def adapter(self, source: str | Path) -> LoraAdapter:
        """The adapter at source (a folder or an fsspec URL), loaded once; AdapterError if it
        cannot serve on this base model."""
        key = str(source)
        self._wait_for_prefetch(key)
        with self._host_lock:
            if key in self._host:
                self._host.move_to_end(key)
                return self._host[key]
        adapter = load_adapter(key, self.config, self.options.max_lora_rank, self.dtype)
        with self._host_lock:
            self._keep(key, adapter)
        return adapter

    def prefetch(self, sources: Iterable[str | Path]) -> list[futures.Future]:
        """Start reading these adapters into the host cache on the prefetch thread; the reads
        started (tests wait on them). At most max_cpu_loras - max_loras at once, so that they
        never push the running wave's adapters out of the host cache."""
        room = self.options.max_cpu_loras - self.options.max_loras
        started = []
        with self._host_lock:
            self._prefetching = {key: read for key, read in self._prefetching.items() if not read.done()}
            for key in dict.fromkeys(map(str, sources)):
                if key in self._host:
                    self._host.move_to_end(key)
                elif key not in self._prefetching and len(self._prefetching) < room:
                    if self._prefetcher is None:
                        self._prefetcher = futures.ThreadPoolExecutor(1, thread_name_prefix="lora-prefetch")
                    self._prefetching[key] = self._prefetcher.submit(self._prefetch_one, key)
                    started.append(self._prefetching[key])
        return started

    @property
    def host_sources(self) -> list[str]:
        """The adapters on the host, least recently used first."""
        with self._host_lock:
            return list(self._host)

    def _prefetch_one(self, key: str) -> None:
        """On the prefetch thread: read one adapter into the host cache, nothing else."""
        try:
            adapter = load_adapter(key, self.config, self.options.max_lora_rank, self.dtype)
        except Exception as error:      # its rows read it again when queued, and carry the error
            log.debug("prefetch of adapter %s failed: %s", key, error)
            return
        with self._host_lock:
            self._keep(key, adapter)
            self.num_prefetched += 1

    def _wait_for_prefetch(self, key: str) -> None:
        """A prefetch of key not yet started is cancelled (the caller reads it now); one under
        way is waited for rather than read twice."""
        with self._host_lock:
            read = self._prefetching.pop(key, None)
        if read is not None and not read.cancel():
            futures.wait([read])

    def _keep(self, key: str, adapter: LoraAdapter) -> None:
        """Under _host_lock: remember an adapter read, evicting the least recently used."""
        self._host[key] = adapter
        self._host.move_to_end(key)
        while len(self._host) > self.options.max_cpu_loras:
            self._host.popitem(last=False)      # requests that hold it keep it alive until they end

    def by_slot(self, requests: list) -> list:
        """requests (each with .adapter) laid out slot by slot, resident slots in order, then
        adapters not yet in a slot (each together), then the base's rows; stable, so an order
        within a slot stays. A CPU step laid out so makes its LoRA rows runs (engine/lora/batch.py)."""
        resident, last = self.slot_table.resident, self.slot_table.num_slots

        def key(request) -> tuple[int, str]:
            if request.adapter is None:
                return last + 1, ""
            return resident.get(request.adapter.adapter_id, last), request.adapter.adapter_id
        return sorted(requests, key=key)

    def batch_for(self, adapters: list[LoraAdapter | None], num_tokens: list[int]) -> LoraBatch | None:
        """adapters: each scheduled request's (None: the base), in the step's token order;
        num_tokens: its tokens in the step. None when no token carries an adapter."""
        used = {adapter.adapter_id: adapter for adapter in adapters if adapter is not None}
        if not used:
            return None
        slot_of, loads = self.slot_table.assign(used)
        for slot, adapter_id in loads:
            self._load_slot(slot, used[adapter_id])
        token_slots = []
        for adapter, count in zip(adapters, num_tokens):
            token_slots += [-1 if adapter is None else slot_of[adapter.adapter_id]] * count
        return build_lora_batch(token_slots, self._slot_scalings, self.device, self.dtype, self.use_kernels)

    def _load_slot(self, slot: int, adapter: LoraAdapter) -> None:
        self._slot_scalings[slot] = adapter.config.scaling
        for layer, linears in enumerate(self._layers):
            for weights in linears:
                weights.load(slot, adapter, layer)
        self.num_slot_loads += 1


AdapterSource = str | Path | None       # a PEFT adapter folder or fsspec URL; None: the base model


def adapters_per_row(adapter: AdapterSource | list[AdapterSource], num_rows: int,
                     manager: LoraManager | None) -> list[AdapterSource]:
    """One adapter for every row, or one per row, as a list; ValueError when the count is wrong
    or an adapter is named to an engine that serves none."""
    rows = list(adapter) if isinstance(adapter, (list, tuple)) else [adapter] * num_rows
    if len(rows) != num_rows:
        raise ValueError(f"adapter has {len(rows)} entries for {num_rows} prompts")
    if manager is None and any(source is not None for source in rows):
        raise ValueError("adapter needs an engine built with LoRA (LLMEngine.load(..., lora=LoraOptions(...)))")
    return rows
