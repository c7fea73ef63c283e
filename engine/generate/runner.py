"""ModelRunner: turns a SchedulerOutput into one forward pass, then samples and scores.

NOTE: on CUDA (attention backend "triton", engine/generate/attention.py) the batch's
attention metadata is FlatMetadata, built once per step from host lists and copied to the
device in one tensor each; decode-only steps then replay a CUDA graph over static copies
of those inputs (engine/generate/cuda_graph.py). Nothing here reads a device value back
except the sampled ids: positions stay a host list for the prompt-logprob targets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate, chain

import torch

from engine.generate.attention import AttentionMetadata, DecodeGroup, FlatMetadata, PrefillChunk, attention_backend
from engine.generate.kv_cache import KVCache
from engine.generate.request import Request
from engine.generate.sampler import Sampler, top_logprobs
from engine.generate.scheduler import SchedulerOutput
from engine.kernels import cpu_ops
from engine.lora.batch import LoraBatch
from engine.lora.manager import LoraManager
from engine.models.llama import LlamaForCausalLM

PADDING_SLACK = 1.25      # a decode group may pad its context up to 25% beyond the real tokens


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor                 # long [num_tokens], decodes first
    positions: torch.Tensor                 # long [num_tokens]
    meta: AttentionMetadata
    sample_requests: list[Request]          # requests whose last token is in this step
    sample_rows: list[int]                  # row of that last token, per sample_requests
    prompt_rows: dict[int, list[int]] = field(default_factory=dict)   # request_id -> rows scoring the next prompt token
    host_positions: list[int] = field(default_factory=list)           # positions, read on the host without a sync
    logit_rows: torch.Tensor | None = None  # long: sample_rows then the prompt rows, copied before the forward
    lora: LoraBatch | None = None           # each token's adapter slot; None: no token has an adapter

    @property
    def is_decode_only(self) -> bool:
        """One new token per sequence: the steps a CUDA graph replays."""
        return self.meta.flat is not None and self.meta.flat.max_query_len == 1


@dataclass
class ModelRunnerOutput:
    sampled_token_ids: dict[int, int]                       # request_id -> new token
    logprobs: dict[int, dict[int, float]]                   # request_id -> {token: logprob}, when asked
    prompt_logprobs: dict[int, list[dict[int, float]]]      # request_id -> one entry per newly scored prompt token


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, kv_cache: KVCache, block_size: int, device: torch.device):
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.device = device
        self.sampler = Sampler()
        # Decode attention in the compiled kernel: fp32 on CPU only, where it can be built.
        self.use_triton = attention_backend(device) == "triton"
        self.use_cpu_kernel = (device.type == "cpu" and not self.use_triton and bool(kv_cache)
                               and kv_cache[0][0].dtype == torch.float32 and cpu_ops.cpu_kernels_available())
        # An fp8 cache is read for every token, a first chunk's too, as the Triton kernel reads
        # it: what CPU measures (perplexity, eval-quant) is what a GPU computes.
        self.is_kv_fp8 = bool(kv_cache) and kv_cache[0].is_fp8
        self.graphs = None      # a CudaGraphRunner (engine/generate/cuda_graph.py), set by LLMEngine on CUDA
        self.lora: LoraManager | None = None    # set by LLMEngine when it serves adapters

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput) -> ModelRunnerOutput:
        batch = self.prepare(output)
        if (self.graphs is not None and batch.is_decode_only and batch.lora is None
                and self.graphs.can_run(batch.meta.flat)):
            hidden = self.graphs.run(batch)
        else:
            hidden = self.model(batch.input_ids, batch.positions, batch.meta, self.kv_cache, batch.lora)
        logits = self.model.compute_logits(hidden[batch.logit_rows])
        sample_logits, prompt_logits = logits[:len(batch.sample_rows)], logits[len(batch.sample_rows):]
        token_ids, logprobs = self.sampler(sample_logits, batch.sample_requests)
        ids = [request.request_id for request in batch.sample_requests]
        return ModelRunnerOutput(dict(zip(ids, token_ids)),
                                 {rid: lp for rid, lp in zip(ids, logprobs) if lp is not None},
                                 self._prompt_logprobs(output, batch, prompt_logits))

    def prepare(self, output: SchedulerOutput) -> ForwardBatch:
        counts = output.num_scheduled_tokens
        # Decodes first, longest context first, so that groups of similar length are adjacent.
        decodes = sorted((r for r in output.requests if counts[r.request_id] == 1),
                         key=lambda r: r.num_computed_tokens, reverse=True)
        prefills = [r for r in output.requests if counts[r.request_id] > 1]
        if self.lora is not None and self.use_cpu_kernel:   # one decode group whatever the order:
            decodes = self.lora.by_slot(decodes)            # the LoRA rows as one run (engine/lora/batch.py),
            prefills = self.lora.by_slot(prefills)          # a prompt step's as a run per slot
        input_ids, positions, slots = [], [], []
        sample_requests, sample_rows, prompt_rows, chunks = [], [], {}, []
        for request in decodes + prefills:
            start, num_new = len(input_ids), counts[request.request_id]
            first = request.num_computed_tokens
            input_ids += request.token_ids[first:first + num_new]
            positions += range(first, first + num_new)
            slots += self._slots(request, first, first + num_new)
            if first + num_new == request.num_tokens:
                sample_requests.append(request)
                sample_rows.append(start + num_new - 1)
            if request.params.prompt_logprobs is not None:
                prompt_rows[request.request_id] = self._prompt_rows(request, start, first, num_new)
            if num_new > 1 and not self.use_triton:
                chunks.append(self._prefill_chunk(request, start, num_new))
        # On the device before the forward: indexing a CUDA tensor with a host list after it
        # would make the host wait for the forward before launching the LM head.
        logit_rows = sample_rows + [row for rows in prompt_rows.values() for row in rows]
        lora = self._lora_batch(decodes + prefills, counts)
        if self.use_triton:
            (input_ids, positions_on_device, slot_mapping, logit_rows), flat = self._flat_inputs(
                decodes + prefills, counts, [input_ids, positions, slots, logit_rows])
            return ForwardBatch(input_ids, positions_on_device, AttentionMetadata(slot_mapping, [], [], flat),
                                sample_requests, sample_rows, prompt_rows, positions, logit_rows, lora)
        meta = AttentionMetadata(torch.tensor(slots, dtype=torch.long, device=self.device),
                                 self._decode_groups(decodes), chunks)
        return ForwardBatch(torch.tensor(input_ids, dtype=torch.long, device=self.device),
                            torch.tensor(positions, dtype=torch.long, device=self.device), meta,
                            sample_requests, sample_rows, prompt_rows, positions,
                            torch.tensor(logit_rows, dtype=torch.long, device=self.device), lora)

    def _lora_batch(self, requests: list[Request], counts: dict[int, int]) -> LoraBatch | None:
        """Each token's adapter slot, in the batch's token order (requests as laid out)."""
        if self.lora is None:
            return None
        return self.lora.batch_for([r.adapter for r in requests], [counts[r.request_id] for r in requests])

    def _flat_inputs(self, requests: list[Request], counts: dict[int, int],
                     token_lists: list[list[int]]) -> tuple[list[torch.Tensor], FlatMetadata]:
        """token_lists (long) on the device, and the Triton kernel's view of the batch in the
        order the tokens were laid out."""
        num_new = [counts[r.request_id] for r in requests]
        seq_lens = [r.num_computed_tokens + count for r, count in zip(requests, num_new)]
        width = max(len(r.block_ids) for r in requests)
        tables = list(chain.from_iterable(r.block_ids + [0] * (width - len(r.block_ids)) for r in requests))
        query_start_loc, seq_lens, tables = self._to_device([[0, *accumulate(num_new)], seq_lens, tables], torch.int32)
        return (self._to_device(token_lists, torch.long),
                FlatMetadata(query_start_loc, seq_lens, tables.view(len(requests), width), max(num_new)))

    def _to_device(self, lists: list[list[int]], dtype: torch.dtype) -> list[torch.Tensor]:
        """Several host lists in one host tensor, copied at once: from pinned memory and
        asynchronously on CUDA, where a tensor made from each list would be a copy that waits
        on the device each time. Returns a view per list."""
        host = torch.tensor(list(chain.from_iterable(lists)), dtype=dtype)
        if self.device.type == "cuda":
            host = host.pin_memory()
        return list(host.to(self.device, non_blocking=True).split([len(values) for values in lists]))

    def _slots(self, request: Request, first: int, end: int) -> list[int]:
        size, table = self.block_size, request.block_ids
        return [table[position // size] * size + position % size for position in range(first, end)]

    def _prompt_rows(self, request: Request, start: int, first: int, num_new: int) -> list[int]:
        """Rows whose logits score a prompt token not yet scored (row at position p scores token p + 1).
        After a preemption the prompt is recomputed; what was scored before is not scored again."""
        num_scored = len(request.prompt_logprobs)
        return [start + offset for offset in range(num_new)
                if num_scored <= first + offset + 1 < request.num_prompt_tokens]

    def _prefill_chunk(self, request: Request, start: int, num_new: int) -> PrefillChunk:
        num_cached = request.num_computed_tokens
        if num_cached == 0 and not self.is_kv_fp8:
            return PrefillChunk(start, num_new, None, 0, None)
        num_context = num_cached + num_new
        block_ids = torch.tensor(request.block_ids, dtype=torch.long, device=self.device)
        # Query i sits at position num_cached + i and sees keys up to and including it.
        query_positions = torch.arange(num_cached, num_context, device=self.device)[:, None]
        mask = torch.arange(num_context, device=self.device)[None, :] <= query_positions
        return PrefillChunk(start, num_new, block_ids, num_context, mask)

    def _decode_groups(self, decodes: list[Request]) -> list[DecodeGroup]:
        """Split decodes (sorted by context length, longest first) where padding to the
        group's longest context would cost more than PADDING_SLACK of the real work.
        The compiled CPU kernel pads nothing: it takes them all as one group."""
        if decodes and self.use_cpu_kernel:
            return [self._decode_group(decodes, 0, with_bias=False)]
        groups, start = [], 0
        while start < len(decodes):
            longest, total, end = decodes[start].num_computed_tokens + 1, 0, start
            while end < len(decodes) and (end - start + 1) * longest <= PADDING_SLACK * (
                    total + decodes[end].num_computed_tokens + 1):
                total += decodes[end].num_computed_tokens + 1
                end += 1
            groups.append(self._decode_group(decodes[start:end], start))
            start = end
        return groups

    def _decode_group(self, decodes: list[Request], start: int, with_bias: bool = True) -> DecodeGroup:
        context_lens = torch.tensor([r.num_computed_tokens + 1 for r in decodes], dtype=torch.long, device=self.device)
        max_blocks = max(len(r.block_ids) for r in decodes)
        table = torch.zeros(len(decodes), max_blocks, dtype=torch.long, device=self.device)
        for row, request in enumerate(decodes):
            table[row, :len(request.block_ids)] = torch.tensor(request.block_ids, dtype=torch.long)
        if not with_bias:
            return DecodeGroup(start, table, context_lens, None)
        is_real = torch.arange(max_blocks * self.block_size, device=self.device)[None, :] < context_lens[:, None]
        bias = torch.zeros(is_real.shape, device=self.device).masked_fill(~is_real, float("-inf"))
        return DecodeGroup(start, table, context_lens, bias.to(self.model.lm_head.weight.dtype))

    def _prompt_logprobs(self, output: SchedulerOutput, batch: ForwardBatch,
                         logits: torch.Tensor) -> dict[int, list[dict[int, float]]]:
        scored, offset = {}, 0
        by_id = {request.request_id: request for request in output.requests}
        for request_id, rows in batch.prompt_rows.items():
            request = by_id[request_id]
            rows_logits = logits[offset:offset + len(rows)]
            offset += len(rows)
            targets = self._prompt_targets(request, batch, rows)
            scored[request_id] = top_logprobs(rows_logits, targets, request.params.prompt_logprobs)
        return scored

    @staticmethod
    def _prompt_targets(request: Request, batch: ForwardBatch, rows: list[int]) -> list[int]:
        # The token a row scores is the next prompt token, which may lie in the next chunk.
        return [request.token_ids[batch.host_positions[row] + 1] for row in rows]
