"""Embedder: the embed mode — tokenize ahead, pack by length, encode, pool, back in input order.

NOTE: on a GPU the host must stay ahead of the device. Tokenization runs on a pool of
threads ahead of the model (engine.embed.tokenizer.tokenize_ahead, bounded); each batch is
packed on the host into pinned memory and copied with non_blocking; its pooled vectors
come back into pinned memory the same way, behind an event; and batch i's vectors are
waited for only after batch i + 1 has been launched, so the one sync per batch
overlaps the next batch's packing and copies with the device's work:

    host    pack 0 | launch 0 | pack 1 | launch 1 | wait 0, store 0 | pack 2 | launch 2 | wait 1 ...
    device           [ batch 0 .......... ][ batch 1 ................ ][ batch 2 ...

On CPU the same loop runs with nothing in flight: each batch's vectors are ready when
its forward returns, and nothing is pinned or copied.

NOTE: a causal model (an LLM embedder) called with a prompt runs the tokens every row of a
chunk starts with once (engine.embed.batching.SharedPrefix): under causal attention their
states do not depend on the text after them. Each row then runs only its own tokens,
attending to the prefix's kept keys and values, and pools with the prefix's states where
its pooling reads them (mean, max, cls; last-token pooling does not). The shared prefix is
found in the rows' token ids, not the prompt's own tokenization (BPE may merge the
prompt's last characters with a text's first), and every row keeps at least its last
token. A later chunk of the call takes a slice of a prefix computed for an earlier one.
Encoders (BERT, ModernBERT) attend both ways and always run whole rows.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from engine.embed.batching import SharedPrefix, pack, plan_batches, shared_prefix_length
from engine.embed.config import EncoderConfig, load_encoder_config
from engine.embed.outputs import EmbeddingOutput
from engine.embed.params import EmbedParams
from engine.embed.tokenizer import Tokenizer, tokenize_ahead
from engine.layers.pooling import finish, first_rows, pool, pool_after_prefix
from engine.layers.fp8_linear import use_fp8_linears
from engine.layers import linear
from engine.layers.packed_linear import HAS_BF16_PACKING, pack_linears
from engine.loader.meta import on_meta
from engine.loader.safetensors import assign_weights, read_weights, weight_files
from engine.models.families import MODEL_TYPES
from engine.oom import OOM_ROW_ERROR, OomGuard
from engine.quant.checkpoint import load_fp8_state
from engine.quant.config import fp8_config_of_folder
from engine.settings import encoder_settings
from engine.step_stats import StepObserver, StepStats, notify
from engine.token_ids import common_prefix

# Rows are tokenized in chunks on a background thread while the model runs the chunk
# before. The first chunk is small so the model starts early; later ones are large so
# each sorts enough rows by length to form batches of few attention groups.
FIRST_CHUNK_ROWS = 256
CHUNK_ROWS = 8192
# Threads tokenizing ahead: one on CPU, where the cores run the model; on a GPU as many
# as the host spares, up to this.
MAX_GPU_TOKENIZE_THREADS = 8
# Fewer shared tokens than this are run with every row: a separate pass costs more than it saves.
MIN_SHARED_PREFIX_TOKENS = 4

log = logging.getLogger("barge.engine")


@dataclass
class EncodeStats:
    """What one encode call ran (Embedder.last_call), as the generate engine's RunStats."""

    num_rows: int = 0                   # rows handed to the model
    num_tokens: int = 0                 # their tokens, prompt included (EmbeddingOutput.num_tokens summed)
    num_prefix_tokens: int = 0          # tokens of shared prefixes, each run once (a slice reused: not again)
    num_shared_prefix_tokens: int = 0   # of num_tokens, those served from a shared prefix (rows x its length)

    @property
    def num_computed_tokens(self) -> int:
        """Tokens the forward passes ran: every row's own, and each shared prefix once."""
        return self.num_tokens - self.num_shared_prefix_tokens + self.num_prefix_tokens


@dataclass
class InFlight:
    """A batch launched on the device whose vectors are still on their way to the host."""

    rows: list[int]                     # [num_seqs] indices into the call's token_ids
    vectors: torch.Tensor               # [num_seqs, dim] on the host (pinned on a GPU), float32
    done: torch.cuda.Event | None       # recorded after the copy to the host; None: ready now


def tokenize_threads(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return max(1, min(MAX_GPU_TOKENIZE_THREADS, (os.cpu_count() or 2) - 1))


class Embedder:
    def __init__(self, config: EncoderConfig, tokenizer: Tokenizer, model: torch.nn.Module,
                 device: torch.device, max_batch_tokens: int):
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
        self.config = config
        self.tokenizer = tokenizer
        self.model = model
        self.device = device
        self.max_batch_tokens = max_batch_tokens
        self.step_observers: list[StepObserver] = []     # called with each forward batch's StepStats
        self.oom_guard = OomGuard.from_env()              # out-of-memory errors survived (engine.oom)
        self.num_tokenize_threads = tokenize_threads(device)
        # Causal attention only: a prompt's states depend on the tokens after it in an encoder.
        self.share_prompt_prefix = config.family == "decoder"
        self.last_call = EncodeStats()                    # the latest encode call's counts
        self._tokenize_pool = ThreadPoolExecutor(max_workers=self.num_tokenize_threads,
                                                 thread_name_prefix="barge-tokenize")

    @classmethod
    def load(cls, folder: str | Path, dtype: torch.dtype, device: torch.device, max_batch_tokens: int,
             quantization: str | None = None) -> "Embedder":
        """quantization: None or "fp8" / "fp8-block" (engine/quant/config.py); a folder whose
        config.json declares FP8 loads as FP8 either way."""
        check_cpu_dtype(dtype, device)
        config = load_encoder_config(folder)
        family = MODEL_TYPES[config.model_type]
        checkpoint_fp8 = fp8_config_of_folder(folder)
        weight_files(folder)              # a missing weights file fails before anything is built
        tokenizer = Tokenizer.from_folder(folder, config.max_seq_length, config.do_lower_case)
        state, fp8 = load_fp8_state(read_weights(folder, family.checkpoint_name_to_ours), checkpoint_fp8, quantization)
        state = family.combine(state, config.architecture)
        with on_meta():
            model = family.build(config.architecture)
        use_fp8_linears(model, state, fp8.block_cols if fp8 else None, fp8.name if fp8 else None)
        assign_weights(model, state, folder)
        model = model.to(device=device, dtype=dtype).eval()
        # CPU fp32: weights reordered once for oneDNN; AVX2 alone: MKL, plain weights. CPU bf16:
        # packed for oneDNN's AMX kernels wherever this CPU has oneDNN's bf16 linears.
        if linear.ONEDNN_PAYS or dtype == torch.bfloat16:
            pack_linears(model, max_batch_tokens, (torch.float32, torch.bfloat16))
        return cls(config, tokenizer, model, device, max_batch_tokens)

    @property
    def embedding_dim(self) -> int:
        return self.config.hidden_size

    @property
    def settings(self) -> dict:
        return encoder_settings(self.model, self.max_batch_tokens, self.config.max_seq_length, self.oom_guard.num_ooms)

    def embed(self, texts: list, params: EmbedParams) -> np.ndarray:
        """[len(texts), dimensions or embedding_dim] of params.output_dtype; raises on the first bad row."""
        params.check(self.embedding_dim)
        for index, text in enumerate(texts):
            error = text_error(text)
            if error:
                raise ValueError(f"row {index}: {error}")
        outputs = self.encode(texts, params)
        for index, output in enumerate(outputs):
            if output.error:
                raise ValueError(f"row {index}: {output.error}")
        if not outputs:
            return np.zeros((0, params.dimensions or self.embedding_dim), dtype=params.numpy_dtype)
        return np.stack([output.embedding for output in outputs])

    def encode(self, texts: list, params: EmbedParams) -> list[EmbeddingOutput]:
        """One EmbeddingOutput per text, in input order; a bad row gets .error, never an exception."""
        params.check(self.embedding_dim)
        outputs: list[EmbeddingOutput | None] = [None] * len(texts)
        valid = []
        for index, text in enumerate(texts):
            error = text_error(text)
            if error:
                outputs[index] = EmbeddingOutput(None, 0, error)
            else:
                valid.append(index)
        prompt = self.config.prompt_for(params.prompt, params.prompt_name)
        stats = self.last_call = EncodeStats()
        prefixes: list[SharedPrefix] = []       # computed in this call, for its later chunks to slice
        for rows, token_ids in self._tokenized_chunks(texts, valid, prompt, params.truncate):
            accepted = []
            for row, ids in zip(rows, token_ids):
                error = self._token_error(len(ids))
                if error:
                    outputs[row] = EmbeddingOutput(None, len(ids), error)
                else:
                    accepted.append((row, ids))
            accepted_ids = [ids for _, ids in accepted]
            prefix = None
            if prompt and self.share_prompt_prefix:
                prefix = self._shared_prefix(accepted_ids, prefixes)
            stats.num_rows += len(accepted_ids)
            stats.num_tokens += sum(len(ids) for ids in accepted_ids)
            stats.num_shared_prefix_tokens += len(accepted_ids) * prefix.num_tokens if prefix else 0
            vectors, errors = self._embed_token_ids(accepted_ids, params, prefix)
            for index, ((row, ids), vector) in enumerate(zip(accepted, vectors)):
                outputs[row] = EmbeddingOutput(None, len(ids), errors[index]) if index in errors else \
                    EmbeddingOutput(vector, len(ids))
        stats.num_prefix_tokens = sum(prefix.num_tokens for prefix in prefixes)
        if stats.num_shared_prefix_tokens:
            log.debug("embed: %d rows, %d tokens; shared prefixes of %s tokens run once served %d tokens, "
                      "%d computed in all", stats.num_rows, stats.num_tokens, [p.num_tokens for p in prefixes],
                      stats.num_shared_prefix_tokens, stats.num_computed_tokens)
        return outputs

    def _shared_prefix(self, token_ids: list[list[int]], prefixes: list[SharedPrefix]) -> SharedPrefix | None:
        """The prefix every row of a chunk shares: a slice of one this call computed already
        where one serves (exact: a causal prefix's first n states are those of n tokens alone),
        else run now and added to `prefixes`; None where the rows share too few tokens."""
        length = shared_prefix_length(token_ids)
        if length < MIN_SHARED_PREFIX_TOKENS:
            return None
        wanted = token_ids[0][:length]
        for known in prefixes:
            reusable = common_prefix(known.token_ids, wanted)
            if reusable >= MIN_SHARED_PREFIX_TOKENS:
                return known.first(reusable)
        if len(token_ids) < 2:      # run apart for one row, it would save nothing
            return None
        try:
            prefix = self._encode_prefix(wanted)
        except torch.OutOfMemoryError as error:     # the rows run whole, as without a prompt
            self.oom_guard.record(error, self.device, f"shared prefix of {length} tokens not used")
            return None
        prefixes.append(prefix)
        return prefix

    @torch.inference_mode()
    def _encode_prefix(self, token_ids: list[int]) -> SharedPrefix:
        if self.step_observers:
            notify(self.step_observers, StepStats(num_seqs=1, num_tokens=len(token_ids), max_num_seqs=None,
                                                  max_num_tokens=self.max_batch_tokens))
        self.oom_guard.check(len(token_ids))
        return self.model.encode_prefix(token_ids)

    def _tokenized_chunks(self, texts: list, rows: list[int], prompt: str,
                          truncate: bool) -> Iterator[tuple[list[int], list]]:
        """(rows, the token ids of prompt + text) chunk by chunk; the next chunks tokenize while
        the caller works (tokenize_ahead). The prompt is text put before the text, as
        sentence-transformers does."""
        bounds = [0, min(FIRST_CHUNK_ROWS, len(rows))]
        while bounds[-1] < len(rows):
            bounds.append(min(bounds[-1] + CHUNK_ROWS, len(rows)))
        chunks = [rows[start:end] for start, end in zip(bounds, bounds[1:]) if end > start]
        texts_by_chunk = ([prompt + texts[row] for row in chunk] for chunk in chunks)
        token_ids = tokenize_ahead(self.tokenizer, texts_by_chunk, truncate, self._tokenize_pool,
                                   depth=self.num_tokenize_threads + 1)
        yield from zip(chunks, token_ids)

    def _token_error(self, num_tokens: int) -> str | None:
        if num_tokens > self.config.max_seq_length:
            return (f"text has {num_tokens} tokens, over the model's max_seq_length of {self.config.max_seq_length} "
                    f"(refused because truncate=False)")
        if num_tokens == 0:
            return "text has no tokens"
        return None

    @torch.inference_mode()
    def _embed_token_ids(self, token_ids: list[list[int]], params: EmbedParams,
                         prefix: SharedPrefix | None = None) -> tuple[np.ndarray, dict[int, str]]:
        """The vectors of token_ids, and the rows that ran out of memory alone (row -> error).
        A batch that runs out of memory is split under a halved budget and run again (engine.oom).
        Behind a prefix every row starts with, only the tokens after it are run."""
        vectors = np.empty((len(token_ids), params.dimensions or self.embedding_dim), dtype=params.numpy_dtype)
        errors: dict[int, str] = {}
        launch = self._launch
        if prefix is not None:
            token_ids = [ids[prefix.num_tokens:] for ids in token_ids]
            launch = partial(self._launch, prefix=prefix)
        lengths = [len(ids) for ids in token_ids]
        pending = plan_batches(lengths, self.max_batch_tokens)
        in_flight: InFlight | None = None
        while pending:
            rows = pending.pop(0)
            try:
                launched = launch(token_ids, rows, params)
            except torch.OutOfMemoryError as error:
                self._after_oom(error, rows, lengths, errors)
                # Every batch still to run is planned again under the lowered budget: those
                # planned before it would run out of memory the same way.
                remaining = [row for batch in [rows, *pending] for row in batch if row not in errors]
                pending = [[remaining[i] for i in part]
                           for part in plan_batches([lengths[row] for row in remaining], self.max_batch_tokens)]
                continue
            if in_flight is not None:       # waited for only now that the next batch runs behind it
                self._store(in_flight, vectors)
            in_flight = launched
        if in_flight is not None:
            self._store(in_flight, vectors)
        return vectors, errors

    def _launch(self, token_ids: list[list[int]], rows: list[int], params: EmbedParams,
                prefix: SharedPrefix | None = None) -> InFlight:
        """Run one batch; on a GPU without waiting for it (its vectors land in pinned memory)."""
        batch = pack(token_ids, rows, prefix)
        on_gpu = self.device.type == "cuda"
        batch = batch.pin().to(self.device, non_blocking=True) if on_gpu else batch.to(self.device)
        num_shared_tokens = len(rows) * prefix.num_tokens if prefix is not None else 0
        if self.step_observers:
            notify(self.step_observers, StepStats(num_seqs=len(rows), num_tokens=batch.num_tokens,
                                                  max_num_seqs=None, max_num_tokens=self.max_batch_tokens,
                                                  num_prefix_cache_hit_tokens=num_shared_tokens))
        self.oom_guard.check(batch.num_tokens)
        if prefix is not None:
            pooled = pool_after_prefix(self.model(batch), batch.seq_lens, self.config.pooling, prefix.hidden)
        elif self.config.pooling == "cls" and getattr(self.model, "runs_rows", False):
            pooled = self.model(batch, rows=first_rows(batch.seq_lens)).float()   # the last layer for [CLS] alone
        else:
            pooled = pool(self.model(batch), batch.seq_lens, self.config.pooling)
        pooled = finish(pooled, params.dimensions, params.normalize)
        if not on_gpu:
            return InFlight(rows, pooled.cpu(), None)
        host = torch.empty(pooled.shape, dtype=pooled.dtype, pin_memory=True)
        host.copy_(pooled, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return InFlight(rows, host, done)

    @staticmethod
    def _store(in_flight: InFlight, vectors: np.ndarray) -> None:
        if in_flight.done is not None:
            in_flight.done.synchronize()    # the one wait of the batch
        vectors[in_flight.rows] = in_flight.vectors.numpy()

    def _after_oom(self, error: BaseException, rows: list[int], lengths: list[int], errors: dict[int, str]) -> None:
        """After `rows` ran out of memory: halve the budget below that batch's tokens, or,
        for a row alone, make it an error row."""
        if len(rows) == 1:
            errors[rows[0]] = f"{OOM_ROW_ERROR} ({lengths[rows[0]]} tokens)"
            self.oom_guard.record(error, self.device, f"row of {lengths[rows[0]]} tokens made an error row")
            return
        batch_tokens = sum(lengths[row] for row in rows)
        self.max_batch_tokens = max(1, min(self.max_batch_tokens, batch_tokens) // 2)
        self.oom_guard.record(error, self.device, f"max_batch_tokens lowered to {self.max_batch_tokens}")


def check_cpu_dtype(dtype: torch.dtype, device: torch.device) -> None:
    """bf16 on a CPU is the AMX path: refused, before anything loads, where oneDNN has no
    bf16 linears (no AVX-512 BF16 / AMX), as it would run slower than fp32 there."""
    if torch.device(device).type == "cpu" and dtype == torch.bfloat16 and not HAS_BF16_PACKING:
        raise ValueError("dtype bfloat16 on CPU needs oneDNN's bf16 linears (AVX-512 with BF16, or AMX), which this "
                         "CPU or PyTorch build lacks; embed in float32 here")


def text_error(text: object) -> str | None:
    """Why a row cannot be embedded, or None when it can."""
    if text is None:
        return "text is null"
    if not isinstance(text, str):
        return f"text is not a string (got {type(text).__name__})"
    return None
