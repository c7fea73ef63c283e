"""ChunkDecoder: encode admitted chunks, then step every running chunk one token at a time.

    step():  admit → encode + cross K/V → (step observers) → decoder step (one token per slot) → sample → release

The decoder step is engine.whisper.decoder_step's: eager on CPU, static buckets replayed
as CUDA graphs on CUDA.

A request's first tokens are forced (the start-of-transcript sequence); the logits after
<|startoftranscript|> also give its no-speech probability and, when no language was
given, the detected language, whose tokens are then forced next.

A chunk with beam_size > 1 runs one row per hypothesis (engine.whisper.beam): the
leader row is fed and read as a greedy chunk's while tokens are forced, its siblings
copy it; after that the beam picks the next rows from all of them together and their
self-attention K/V follow the picks.

Out of memory (engine.oom): the K/V slots are allocated once, so what a step can run out of
is activations, which grow with the chunks encoded at once and the rows decoded at once.
An encoder batch that runs out puts its chunks back at the head of the queue and halves
max_admit; a decoder step that runs out puts its newest chunks back (they start over,
from their encoder output, to the same tokens) and halves the rows decoded together
(scheduler.max_running). Both stay lowered. Only a chunk that runs out alone, at the
floor, finishes with error = OOM_ROW_ERROR, and its file becomes an error row.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.oom import OOM_ROW_ERROR, OomGuard, halved
from engine.settings import model_settings
from engine.step_stats import StepObserver, StepStats, notify
from engine.whisper.beam import BeamSearch
from engine.whisper.config import HOP_LENGTH, N_SAMPLES_PER_CHUNK
from engine.whisper.decoder_step import DecoderStep, attention_backends
from engine.whisper.kv_cache import DecoderCache
from engine.whisper.logit_rules import LogitRules, max_initial_timestamp_index
from engine.whisper.mel import log_mel
from engine.whisper.model import Whisper
from engine.whisper.request import DecodeRequest
from engine.whisper.scheduler import Scheduler
from engine.whisper.tokenizer import WhisperTokenizer


class ChunkDecoder:
    def __init__(self, model: Whisper, tokenizer: WhisperTokenizer, rules: LogitRules,
                 max_slots: int, max_admit: int, use_graphs: bool | None = None):
        parameter = next(model.parameters())
        self.model, self.tokenizer, self.rules = model, tokenizer, rules
        self.device, self.dtype = parameter.device, parameter.dtype
        self.cache = DecoderCache(model.config, max_slots, self.dtype, self.device)
        # CUDA: static buckets replayed as graphs (use_graphs=False: static, eager); CPU: eager.
        self.decoder_step = DecoderStep.for_device(model, self.cache, use_graphs)
        self.scheduler = Scheduler(self.cache, max_admit)
        self.num_steps = 0         # decoder steps run, for stats and benchmarks
        self.num_encoded = 0       # chunks through the encoder (fallback re-runs reuse theirs)
        self.step_observers: list[StepObserver] = []     # called with each decoder step's StepStats
        self.oom_guard = OomGuard.from_env()    # out-of-memory errors survived; the test hook counts rows

    @property
    def settings(self) -> dict:
        """dtype, device, quantization; max_slots (chunks decoded together) and max_admit
        (chunks encoded in one batch)."""
        settings = {**model_settings(self.model), "max_slots": self.cache.max_slots,
                    "max_admit": self.scheduler.max_admit}
        if self.oom_guard.num_ooms:     # the budgets it runs under now
            settings.update(max_running=self.scheduler.max_running, num_oom_retries=self.oom_guard.num_ooms)
        return settings

    def add(self, request: DecodeRequest, first: bool = False) -> None:
        self.check_beam_size(request.options.beam_size)
        if request.options.beam_size > 1 and request.beam is None:
            BeamSearch.around(request, self.tokenizer.eot)
        self.scheduler.add(request, first)

    def check_beam_size(self, beam_size: int) -> None:
        """A chunk's hypotheses all decode at once, one slot each."""
        if beam_size > self.cache.max_slots:
            raise ValueError(f"beam_size {beam_size} needs {beam_size} decoder slots, but this engine has "
                             f"max_slots={self.cache.max_slots}; load it with more slots or choose a smaller beam")

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def cancel(self, is_dropped) -> list[DecodeRequest]:
        """Drop the queued (not running) requests is_dropped picks; returns them."""
        dropped = [request for request in self.scheduler.waiting if is_dropped(request)]
        for request in dropped:
            self.scheduler.waiting.remove(request)
        return dropped

    @torch.inference_mode()
    def step(self) -> list[DecodeRequest]:
        """One decoder step over every running request; returns those that finished."""
        with attention_backends(self.device):
            return self._step()

    def _step(self) -> list[DecodeRequest]:
        admitted = self.scheduler.admit(lambda request: request.is_ready)
        if admitted:
            try:
                self.oom_guard.check(len(admitted))
                self._start(admitted)
            except torch.OutOfMemoryError as error:
                return self._after_encoder_oom(error, admitted)
        running = self.scheduler.running
        if not running:
            return []
        if self.step_observers:
            notify(self.step_observers, self._step_stats(len(running)))
        try:
            self.oom_guard.check(len(running))
            logits = self.decoder_step([r.next_token for r in running], [r.position for r in running])
        except torch.OutOfMemoryError as error:
            return self._after_decoder_oom(error)
        self.num_steps += 1
        finished = self._advance(running, logits)
        self.scheduler.release(finished)
        return finished

    def _after_encoder_oom(self, error: BaseException, admitted: list[DecodeRequest]) -> list[DecodeRequest]:
        """The admitted chunks go back to the queue's head under a halved max_admit; a chunk
        admitted alone at max_admit 1 finishes with the error. Returns the chunks that finished."""
        lower = halved(len(admitted), 1)
        if lower is None:
            self.oom_guard.record(error, self.device, "a chunk that does not fit alone ends with an error")
            return self._fail(admitted)
        self.scheduler.max_admit = min(self.scheduler.max_admit, lower)
        self.oom_guard.record(error, self.device, f"max_admit lowered to {self.scheduler.max_admit}")
        self._requeue(admitted)
        return []

    def _after_decoder_oom(self, error: BaseException) -> list[DecodeRequest]:
        """The newest running chunks go back to the queue's head until half the rows are
        left, and at most that many rows decode together from now on; a chunk that ran alone
        finishes with the error. Returns the chunks that finished."""
        scheduler = self.scheduler
        leaders = [row for row in scheduler.running if row.is_leader]
        if len(leaders) == 1:
            self.oom_guard.record(error, self.device, "a chunk that does not fit alone ends with an error")
            return self._fail(leaders)
        scheduler.max_running = max(len(leaders[0].rows), halved(len(scheduler.running), 1))
        newest = sorted(leaders, key=lambda request: request.request_id)
        kept_rows = len(scheduler.running)
        evicted = []
        while len(newest) > 1 and kept_rows > scheduler.max_running:
            evicted.append(newest.pop())
            kept_rows -= len(evicted[-1].rows)
        self.oom_guard.record(error, self.device, f"{len(evicted)} chunks put back and rows decoded together "
                                                  f"lowered to {scheduler.max_running}")
        self._requeue(evicted[::-1])
        return []

    def _requeue(self, requests: list[DecodeRequest]) -> None:
        self.scheduler.requeue(requests)
        for request in requests:
            if request.options.beam_size > 1:
                BeamSearch.around(request, self.tokenizer.eot)

    def _fail(self, requests: list[DecodeRequest]) -> list[DecodeRequest]:
        self.scheduler.release(requests)
        for request in requests:
            request.error, request.is_finished, request.beam = OOM_ROW_ERROR, True, None
        return requests

    def _step_stats(self, num_running: int) -> StepStats:
        """One token per running chunk; a chunk's slot is its whole K/V, so slots are the blocks."""
        max_slots = self.cache.max_slots
        return StepStats(num_seqs=num_running, num_tokens=num_running, max_num_seqs=max_slots, max_num_tokens=None,
                         num_kv_blocks_used=num_running, num_kv_blocks=max_slots)

    def encode(self, audio: list[np.ndarray], zeros_past_end: bool = True) -> torch.Tensor:
        """Chunks of <= 30 s -> encoder output [k, n_audio_ctx, n_audio_state]; the audio
        is padded with silence to 30 s and, with zeros_past_end, the log-Mel past the
        chunk's own frames is zeros (see below)."""
        self.num_encoded += len(audio)
        batch = torch.zeros(len(audio), N_SAMPLES_PER_CHUNK)
        for row, samples in enumerate(audio):
            batch[row, :len(samples)] = torch.from_numpy(samples[:N_SAMPLES_PER_CHUNK])
        mel = log_mel(batch.to(self.device), self.model.config.n_mels)
        # Past the chunk's own frames the window holds zeros, as openai-whisper's transcribe
        # (and faster-whisper) pad it: the log-Mel of padded silence is not what they feed.
        for row, samples in enumerate(audio):
            if zeros_past_end:
                mel[row, :, min(len(samples), N_SAMPLES_PER_CHUNK) // HOP_LENGTH:] = 0
        return self.model.encoder(mel.to(self.dtype))

    def _start(self, admitted: list[DecodeRequest]) -> None:
        fresh = [r for r in admitted if r.audio_features is None]
        if fresh:
            for request, features in zip(fresh, self.encode([r.audio() for r in fresh])):
                request.audio_features = features
        slot = len(self.scheduler.running) - sum(len(r.rows) for r in admitted)
        leader_slots = []
        for request in admitted:
            leader_slots.append(slot)
            slot += len(request.rows)
        self.model.decoder.write_cross(self.cache, leader_slots, torch.stack([r.audio_features for r in admitted]))
        for request, leader_slot in zip(admitted, leader_slots):
            self.cache.copy_cross(leader_slot, list(range(leader_slot + 1, leader_slot + len(request.rows))))
            if request.language is None and request.language_from is not None:
                request.language = request.language_from.language
            if request.prompt:
                request.pending.extend([self.tokenizer.sot_prev, *request.prompt])
            if request.language is None:
                request.pending.append(self.tokenizer.sot)      # the rest once the language is known
            else:
                request.pending.extend(self._sot_sequence(request))
            if request.options.temperature > 0:
                request.generator = torch.Generator(device="cpu").manual_seed(request.options.seed)
            if request.beam is not None:
                request.beam.follow_leader()

    def _sot_sequence(self, request: DecodeRequest) -> list[int]:
        options = request.options
        return self.tokenizer.sot_sequence(request.language, options.task, options.with_timestamps)

    def _advance(self, running: list[DecodeRequest], logits: torch.Tensor) -> list[DecodeRequest]:
        """Each row took its next token; leaders move past forced tokens, then greedy rows
        sample and each beam picks its next rows. Returns the chunks that finished."""
        for row in running:
            row.fed.append(row.next_token)
        greedy, beams = [], []
        for slot, request in enumerate(running):
            if not request.is_leader or (request.pending and not self._pass_forced(request, logits[slot])):
                continue
            (greedy if request.beam is None else beams).append(slot)
        finished = self._sample([running[slot] for slot in greedy], logits[greedy]) if greedy else []
        slot_of = {id(row): slot for slot, row in enumerate(running)}
        for slot in beams:
            finished += self._beam_step(running[slot].beam, logits, slot_of)
        return finished

    def _pass_forced(self, request: DecodeRequest, logits: torch.Tensor) -> bool:
        """The forced token just fed is done; True when it was the last (its logits give the first sample)."""
        token = request.pending.popleft()
        if token == self.tokenizer.sot:
            self._read_sot_logits(request, logits)
        if request.beam is not None:
            request.beam.follow_leader()
        return not request.pending

    def _read_sot_logits(self, request: DecodeRequest, logits: torch.Tensor) -> None:
        probs = logits.float().softmax(dim=-1)
        request.no_speech_prob = float(probs[self.tokenizer.no_speech])
        if request.language is None:
            codes = list(self.tokenizer.language_ids)
            language_probs = logits[list(self.tokenizer.language_ids.values())].float().softmax(dim=-1)
            request.language_probs = dict(zip(codes, language_probs.tolist()))
            request.language = codes[int(language_probs.argmax())]
            request.pending.extend(self._sot_sequence(request)[1:])

    def _apply_rules(self, requests: list[DecodeRequest], logits: torch.Tensor) -> None:
        self.rules.apply(logits, [r.output for r in requests], [r.options.with_timestamps for r in requests],
                         [max_initial_timestamp_index(r.options.max_initial_timestamp_s) for r in requests])

    def _beam_step(self, beam: BeamSearch, logits: torch.Tensor, slot_of: dict[int, int]) -> list[DecodeRequest]:
        """rules per hypothesis → candidates → rows (and their self K/V) reordered → done?"""
        slots = [slot_of[id(row)] for row in beam.rows]
        rows_logits = logits[slots]
        self._apply_rules(beam.rows, rows_logits)
        live = beam.candidates(torch.log_softmax(rows_logits, dim=-1))
        self.cache.reorder(slots, [slots[c.source] for c in live], beam.leader.position)
        beam.advance(live)
        leader = beam.leader
        if (beam.is_done or len(leader.output) >= leader.options.max_new_tokens
                or leader.position + 1 >= self.model.config.n_text_ctx):
            beam.finish()
            leader.is_finished = True
            return [leader]
        return []

    def _sample(self, requests: list[DecodeRequest], logits: torch.Tensor) -> list[DecodeRequest]:
        self._apply_rules(requests, logits)
        logprobs = torch.log_softmax(logits, dim=-1)
        tokens = logits.argmax(dim=-1).tolist()
        for row, request in enumerate(requests):
            if request.options.temperature > 0:
                probs = torch.softmax(logits[row] / request.options.temperature, dim=-1).cpu()
                tokens[row] = int(torch.multinomial(probs, 1, generator=request.generator))
        # One read of the device for every row's log-probability, not one per row.
        chosen = torch.tensor(tokens, device=logprobs.device)[:, None]
        token_logprobs = logprobs.gather(1, chosen)[:, 0].tolist()
        finished = []
        for row, request in enumerate(requests):
            token = tokens[row]
            request.sum_logprob += token_logprobs[row]
            if token != self.tokenizer.eot:
                request.output.append(token)
            if (token == self.tokenizer.eot or len(request.output) >= request.options.max_new_tokens
                    or request.position + 1 >= self.model.config.n_text_ctx):
                request.is_finished = True
                finished.append(request)
        return finished
