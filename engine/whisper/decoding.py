"""ChunkDecoder: encode admitted chunks, then step every running chunk one token at a time.

    step():  admit → encode + cross K/V → (step observers) → decoder step (one token per slot) → sample → release

A request's first tokens are forced (the start-of-transcript sequence); the logits after
<|startoftranscript|> also give its no-speech probability and, when no language was
given, the detected language, whose tokens are then forced next.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.settings import model_settings
from engine.step_stats import StepObserver, StepStats, notify
from engine.whisper.config import N_SAMPLES_PER_CHUNK
from engine.whisper.kv_cache import DecoderCache
from engine.whisper.logit_rules import LogitRules, max_initial_timestamp_index
from engine.whisper.mel import log_mel
from engine.whisper.model import Whisper
from engine.whisper.request import DecodeRequest
from engine.whisper.scheduler import Scheduler
from engine.whisper.tokenizer import WhisperTokenizer


class ChunkDecoder:
    def __init__(self, model: Whisper, tokenizer: WhisperTokenizer, rules: LogitRules,
                 max_slots: int, max_admit: int):
        parameter = next(model.parameters())
        self.model, self.tokenizer, self.rules = model, tokenizer, rules
        self.device, self.dtype = parameter.device, parameter.dtype
        self.cache = DecoderCache(model.config, max_slots, self.dtype, self.device)
        self.scheduler = Scheduler(self.cache, max_admit)
        self.num_steps = 0         # decoder steps run, for stats and benchmarks
        self.num_encoded = 0       # chunks through the encoder (fallback re-runs reuse theirs)
        self.step_observers: list[StepObserver] = []     # called with each decoder step's StepStats

    @property
    def settings(self) -> dict:
        """dtype, device, quantization; max_slots (chunks decoded together) and max_admit
        (chunks encoded in one batch)."""
        return {**model_settings(self.model), "max_slots": self.cache.max_slots,
                "max_admit": self.scheduler.max_admit}

    def add(self, request: DecodeRequest, first: bool = False) -> None:
        self.scheduler.add(request, first)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    @torch.inference_mode()
    def step(self) -> list[DecodeRequest]:
        """One decoder step over every running request; returns those that finished."""
        admitted = self.scheduler.admit(lambda request: request.is_ready)
        if admitted:
            self._start(admitted)
        running = self.scheduler.running
        if not running:
            return []
        if self.step_observers:
            notify(self.step_observers, self._step_stats(len(running)))
        tokens = torch.tensor([r.next_token for r in running], device=self.device)
        positions = torch.tensor([r.position for r in running], device=self.device)
        logits = self.model.decoder.step(tokens, positions, self.cache)
        self.num_steps += 1
        finished = self._advance(running, logits)
        self.scheduler.release(finished)
        return finished

    def _step_stats(self, num_running: int) -> StepStats:
        """One token per running chunk; a chunk's slot is its whole K/V, so slots are the blocks."""
        max_slots = self.cache.max_slots
        return StepStats(num_seqs=num_running, num_tokens=num_running, max_num_seqs=max_slots, max_num_tokens=None,
                         num_kv_blocks_used=num_running, num_kv_blocks=max_slots)

    def encode(self, audio: list[np.ndarray]) -> torch.Tensor:
        """Chunks of <= 30 s -> encoder output [k, n_audio_ctx, n_audio_state] (zero-padded to 30 s)."""
        self.num_encoded += len(audio)
        batch = torch.zeros(len(audio), N_SAMPLES_PER_CHUNK)
        for row, samples in enumerate(audio):
            batch[row, :len(samples)] = torch.from_numpy(samples[:N_SAMPLES_PER_CHUNK])
        mel = log_mel(batch.to(self.device), self.model.config.n_mels)
        return self.model.encoder(mel.to(self.dtype))

    def _start(self, admitted: list[DecodeRequest]) -> None:
        fresh = [r for r in admitted if r.audio_features is None]
        if fresh:
            for request, features in zip(fresh, self.encode([r.audio() for r in fresh])):
                request.audio_features = features
        first_slot = len(self.scheduler.running) - len(admitted)
        self.model.decoder.write_cross(self.cache, first_slot, torch.stack([r.audio_features for r in admitted]))
        for request in admitted:
            if request.language is None and request.language_from is not None:
                request.language = request.language_from.language
            if request.language is None:
                request.pending.append(self.tokenizer.sot)      # the rest once the language is known
            else:
                request.pending.extend(self._sot_sequence(request))
            if request.options.temperature > 0:
                request.generator = torch.Generator(device="cpu").manual_seed(request.options.seed)

    def _sot_sequence(self, request: DecodeRequest) -> list[int]:
        options = request.options
        return self.tokenizer.sot_sequence(request.language, options.task, options.with_timestamps)

    def _advance(self, running: list[DecodeRequest], logits: torch.Tensor) -> list[DecodeRequest]:
        sampling = []
        for row, request in enumerate(running):
            token = request.next_token
            request.fed.append(token)
            if not request.pending:
                sampling.append(row)
                continue
            request.pending.popleft()
            if token == self.tokenizer.sot:
                self._read_sot_logits(request, logits[row])
            if not request.pending:       # the last forced token: its logits give the first sample
                sampling.append(row)
        return self._sample([running[row] for row in sampling], logits[sampling]) if sampling else []

    def _read_sot_logits(self, request: DecodeRequest, logits: torch.Tensor) -> None:
        probs = logits.float().softmax(dim=-1)
        request.no_speech_prob = float(probs[self.tokenizer.no_speech])
        if request.language is None:
            codes = list(self.tokenizer.language_ids)
            language_probs = logits[list(self.tokenizer.language_ids.values())].float().softmax(dim=-1)
            request.language_probs = dict(zip(codes, language_probs.tolist()))
            request.language = codes[int(language_probs.argmax())]
            request.pending.extend(self._sot_sequence(request)[1:])

    def _sample(self, requests: list[DecodeRequest], logits: torch.Tensor) -> list[DecodeRequest]:
        self.rules.apply(logits, [r.output for r in requests], [r.options.with_timestamps for r in requests],
                         [max_initial_timestamp_index(r.options.max_initial_timestamp_s) for r in requests])
        logprobs = torch.log_softmax(logits, dim=-1)
        tokens = logits.argmax(dim=-1).tolist()
        finished = []
        for row, request in enumerate(requests):
            if request.options.temperature > 0:
                probs = torch.softmax(logits[row] / request.options.temperature, dim=-1).cpu()
                tokens[row] = int(torch.multinomial(probs, 1, generator=request.generator))
            token = tokens[row]
            request.sum_logprob += float(logprobs[row, token])
            if token != self.tokenizer.eot:
                request.output.append(token)
            if (token == self.tokenizer.eot or len(request.output) >= request.options.max_new_tokens
                    or request.position + 1 >= self.model.config.n_text_ctx):
                request.is_finished = True
                finished.append(request)
        return finished
