"""Transcriber: long-form transcription of many files at once.

    files → decode + resample → VAD chunks (<= 30 s) → one DecodeRequest per chunk   (threads, ahead)
          → ChunkDecoder (chunks of all files decoded together) → quality check per chunk
          → stitched back per file in time order: text, segments, language, duration_s

NOTE: a chunk whose text compresses too well (a loop) or whose tokens are too unlikely
is decoded again at the next temperature (0.2, 0.4, ...) from the same encoder output
(a beam search decodes at temperature 0 only; the fallbacks sample, as openai-whisper's
transcribe does); when every temperature fails it is cut in two at its quietest point
and each half starts over, once. A chunk the model thinks is silence (no-speech probability > 0.6
with unlikely tokens) contributes nothing. These are openai-whisper's thresholds.

Whisper sometimes ends a chunk early, leaving its last sentence untranscribed. Like
openai-whisper's seek, the rest of such a chunk (when VAD hears speech there) is
decoded again as a chunk of its own, starting where the last segment ended.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from engine.oom import OOM_ROW_ERROR, in_halves
from engine.whisper.alignment import AlignmentInput, align
from engine.whisper.audio import Audio, AudioError, load_audio
from engine.whisper.chunk import Chunk
from engine.whisper.config import HOP_LENGTH, SAMPLE_RATE
from engine.whisper.decoding import ChunkDecoder
from engine.whisper.language import detect_languages
from engine.whisper.logit_rules import compression_ratio
from engine.whisper.outputs import Segment, TranscriptionOutput, Word
from engine.whisper.params import TranscribeParams
from engine.whisper.request import DecodeOptions, DecodeRequest
from engine.whisper.segments import token_segments
from engine.whisper.sequential import SequentialState
from engine.whisper.vad import FileSpeech, analyse, make_chunks, split_chunk
from engine.whisper.words import TimedSegment, place_words

COMPRESSION_RATIO_THRESHOLD = 2.4
LOGPROB_THRESHOLD = -1.0
NO_SPEECH_THRESHOLD = 0.6
MAX_SPLIT_DEPTH = 1
MIN_SPLIT_S = 4.0            # halves shorter than this are not worth a re-chunk
MIN_UNHEARD_SPEECH_S = 0.5   # speech after a chunk's last segment that earns a continuation
MAX_CONTINUATIONS = 2        # of one chunk: each costs an encoder pass
MAX_PENDING_ALIGNMENTS = 8   # accepted chunks holding their encoder output until a batched alignment pass
AUDIO_THREADS = 4            # files decoded (PyAV, which releases the GIL) and VAD-analysed at once


@dataclass(eq=False)
class FileWork:
    audio: Audio
    speech: FileSpeech
    language: str | None
    language_probability: float | None = None      # when detected (engine.whisper.language)
    chunks: dict[int, tuple[str, list[Segment]]] = field(default_factory=dict)   # start sample -> (raw text, segments)
    num_tokens: int = 0
    first_request: DecodeRequest | None = None
    error: str | None = None                       # a chunk of it could not be decoded (out of memory alone)

    def output(self) -> TranscriptionOutput:
        if self.error is not None:
            return TranscriptionOutput(text=None, duration_s=round(self.audio.duration_s, 3), error=self.error,
                                       num_tokens=self.num_tokens)
        ordered = [self.chunks[start] for start in sorted(self.chunks)]
        language = self.language or (self.first_request.language if self.first_request else None)
        return TranscriptionOutput(text="".join(raw for raw, _ in ordered).strip(),
                                   segments=[s for _, segments in ordered for s in segments],
                                   language=language, duration_s=round(self.audio.duration_s, 3),
                                   language_probability=self.language_probability,
                                   num_tokens=self.num_tokens)


@dataclass(frozen=True)
class PendingAlignment:
    """An accepted chunk whose words are still to be timed (word_timestamps=True)."""

    file: FileWork
    chunk: Chunk
    segments: list[TimedSegment]      # chunk-relative times
    inputs: AlignmentInput


@dataclass(frozen=True)
class ChunkJob:
    file: FileWork
    chunk: Chunk               # what of the file this window holds
    attempt: int               # index into the temperatures
    depth: int                 # re-chunks so far
    hops: int = 0              # continuations past an early end so far
    state: SequentialState | None = None   # long_form="sequential": the file's window progress


class Transcriber:
    def __init__(self, decoder: ChunkDecoder):
        self.decoder = decoder
        self.tokenizer = decoder.tokenizer
        self._ids = itertools.count()
        self._pending: list[PendingAlignment] = []

    def transcribe(self, sources: list, params: TranscribeParams) -> list[TranscriptionOutput]:
        self.tokenizer.check_language(params.language)
        self.decoder.check_beam_size(params.beam_size)
        language = params.language or (None if self.tokenizer.is_multilingual else "en")
        jobs: dict[int, ChunkJob] = {}
        with ThreadPoolExecutor(AUDIO_THREADS, thread_name_prefix="barge-audio") as pool:
            opening = deque(pool.submit(self._open, source, language) for source in sources)
            works: list[FileWork | TranscriptionOutput] = []
            if language is None or not self._streams_files:
                works = [future.result() for future in opening]
                opening.clear()
                if language is None:
                    self._detect([work for work in works if isinstance(work, FileWork)])
                for work in works:
                    self._start_file(jobs, work, params)
            while opening or self.decoder.has_work:
                # Files join in their order as their audio is ready; wait only when the decoder is idle.
                while opening and (opening[0].done() or not self.decoder.has_work):
                    works.append(opening.popleft().result())
                    self._start_file(jobs, works[-1], params)
                if self.decoder.has_work:
                    self._step(jobs, params)
        self._align_pending()
        return [work.output() if isinstance(work, FileWork) else work for work in works]

    @property
    def _streams_files(self) -> bool:
        """CUDA decodes the first files while later ones are still being read; the CPU, whose
        cores the readers would take, reads them all first (and keeps its batches as they were)."""
        return self.decoder.device.type == "cuda"

    def _start_file(self, jobs: dict, work: FileWork | TranscriptionOutput, params: TranscribeParams) -> None:
        if isinstance(work, FileWork) and work.error is None and params.long_form == "sequential":
            state = SequentialState(work.audio.num_samples // HOP_LENGTH)
            if not state.is_done:
                self._submit_window(jobs, work, state, params)
        elif isinstance(work, FileWork) and work.error is None:
            for chunk in make_chunks(work.speech, params.vad):
                request = self._submit(jobs, ChunkJob(work, chunk, 0, 0), params)
                work.first_request = work.first_request or request

    def _step(self, jobs: dict, params: TranscribeParams) -> None:
        for request in self.decoder.step():
            self._finish(jobs, jobs.pop(request.request_id), request, params)
        if len(self._pending) >= MAX_PENDING_ALIGNMENTS:
            self._align_pending()

    def _detect(self, files: list[FileWork]) -> None:
        """Each file's language (and its probability) before any chunk of it decodes; a file
        whose first 30 s do not fit through the encoder alone is an error row (engine.oom)."""
        decoder = self.decoder
        all_probs = in_halves([file.audio for file in files],
                              lambda audios: detect_languages(decoder, audios, decoder.scheduler.max_admit),
                              decoder.oom_guard, decoder.device)
        for file, probs in zip(files, all_probs):
            if probs is None:
                file.error = OOM_ROW_ERROR
                continue
            file.language = max(probs, key=probs.get)
            file.language_probability = probs[file.language]

    def _open(self, source, language: str | None) -> FileWork | TranscriptionOutput:
        try:
            audio = load_audio(source)
            return FileWork(audio, analyse(audio), language)
        except AudioError as exc:
            return TranscriptionOutput(text=None, error=str(exc))

    def _submit(self, jobs: dict, job: ChunkJob, params: TranscribeParams, features=None,
                first: bool = False) -> DecodeRequest:
        file, chunk = job.file, job.chunk
        temperature = params.temperatures[job.attempt]
        options = DecodeOptions(task=params.task, temperature=temperature, with_timestamps=params.with_timestamps,
                                seed=chunk.start * 8 + job.attempt, beam_size=params.beam_size_at(temperature))
        is_first = file.first_request is None
        request = DecodeRequest(next(self._ids), lambda: chunk.samples(file.audio), options,
                                language=file.language, audio_features=features,
                                language_from=None if is_first else file.first_request,
                                prompt=job.state.prompt if job.state is not None else [])
        jobs[request.request_id] = job
        self.decoder.add(request, first)
        return request

    def _finish(self, jobs: dict, job: ChunkJob, request: DecodeRequest, params: TranscribeParams) -> None:
        """check → retry hotter, or re-chunk, or accept (and continue past an early end)."""
        file = job.file
        if request.error is not None:
            # A chunk that does not fit alone: the file gets no transcript, so its chunks still
            # queued are dropped (some wait on this one's language) and those running are ignored.
            file.error = request.error
            for dropped in self.decoder.cancel(lambda queued: jobs[queued.request_id].file is file):
                jobs.pop(dropped.request_id)
            return
        if file.error is not None:
            return
        file.num_tokens += len(request.output) + 1
        if file.language is None and file.first_request is not None:
            file.language = file.first_request.language      # every later chunk decodes in it
        raw_text = self.tokenizer.decode(request.output)
        is_silent = request.no_speech_prob > NO_SPEECH_THRESHOLD
        is_unlikely = request.avg_logprob < LOGPROB_THRESHOLD
        needs_fallback = not is_silent and (is_unlikely or compression_ratio(raw_text) > COMPRESSION_RATIO_THRESHOLD)
        if needs_fallback and job.attempt + 1 < len(params.temperatures):
            retry = dataclasses.replace(job, attempt=job.attempt + 1)
            self._submit(jobs, retry, params, features=request.audio_features, first=True)
            return
        features, request.audio_features = request.audio_features, None
        if job.state is not None:
            self._accept_window(jobs, job, request, params, features, skip=is_silent and is_unlikely)
            return
        if needs_fallback and self._can_split(job):
            for half in split_chunk(file.speech, job.chunk):
                self._submit(jobs, ChunkJob(file, half, 0, job.depth + 1, job.hops), params, first=True)
            return
        if is_silent and is_unlikely:
            file.chunks[job.chunk.start] = ("", [])
            return
        self._accept(jobs, job, request, raw_text, params, features)

    def _accept(self, jobs: dict, job: ChunkJob, request: DecodeRequest, raw_text: str, params: TranscribeParams,
                features) -> None:
        file, chunk = job.file, job.chunk
        in_chunk = [TimedSegment(start, end, ids) for start, end, ids in
                    token_segments(request.output, self.tokenizer, chunk.num_samples / SAMPLE_RATE)]
        file.chunks[chunk.start] = (raw_text, self._file_segments(chunk, in_chunk))
        if params.word_timestamps and in_chunk:
            sot = self.tokenizer.sot_sequence(request.language, params.task, with_timestamps=True)
            inputs = AlignmentInput(features, sot, [t for s in in_chunk for t in s.text_tokens],
                                    chunk.num_samples // HOP_LENGTH, request.language)
            self._pending.append(PendingAlignment(file, chunk, in_chunk, inputs))
        heard_until = round(in_chunk[-1].end * SAMPLE_RATE) if in_chunk else chunk.num_samples
        rest = chunk.sub(heard_until, chunk.num_samples)
        if (job.hops < MAX_CONTINUATIONS and 0 < heard_until < chunk.num_samples
                and sum(file.speech.speech_s(s, e) for s, e in rest.pieces) >= MIN_UNHEARD_SPEECH_S):
            self._submit(jobs, ChunkJob(file, rest, 0, job.depth, job.hops + 1), params, first=True)

    def _submit_window(self, jobs: dict, file: FileWork, state: SequentialState, params: TranscribeParams) -> None:
        start = state.seek * HOP_LENGTH
        chunk = Chunk(((start, min(start + state.window_frames * HOP_LENGTH, file.audio.num_samples)),))
        request = self._submit(jobs, ChunkJob(file, chunk, 0, 0, state=state), params, first=True)
        file.first_request = file.first_request or request

    def _accept_window(self, jobs: dict, job: ChunkJob, request: DecodeRequest, params: TranscribeParams,
                       features, skip: bool) -> None:
        """A sequential window is final (after its fallbacks): keep its segments, decode the next."""
        file, state = job.file, job.state
        if skip:
            state.skip_window()
        else:
            window = state.advance(request.output, self.tokenizer.timestamp_begin, request.options.temperature,
                                   has_text=lambda ids: bool(self.tokenizer.decode(ids).strip()))
            in_window = [TimedSegment(start, end, [t for t in ids if t < self.tokenizer.eot])
                         for start, end, ids in window]
            raw_text = "".join(self.tokenizer.decode(s.text_tokens) for s in in_window)
            file.chunks[job.chunk.start] = (raw_text, self._file_segments(job.chunk, in_window))
            if params.word_timestamps and in_window:
                sot = self.tokenizer.sot_sequence(request.language, params.task, with_timestamps=True)
                inputs = AlignmentInput(features, sot, [t for s in in_window for t in s.text_tokens],
                                        job.chunk.num_samples // HOP_LENGTH, request.language)
                self._pending.append(PendingAlignment(file, job.chunk, in_window, inputs))
        if not state.is_done:
            self._submit_window(jobs, file, state, params)

    def _file_segments(self, chunk: Chunk, segments: list[TimedSegment]) -> list[Segment]:
        """Chunk-relative segments (with their words, once timed) on the file's time line."""
        def words(segment: TimedSegment) -> tuple[Word, ...]:
            return tuple(Word(w.word, round(chunk.to_file_s(w.start), 3), round(chunk.to_file_s(w.end, is_end=True), 3),
                              w.probability) for w in segment.words)
        return [Segment(round(chunk.to_file_s(s.start), 3), round(chunk.to_file_s(max(s.start, s.end), is_end=True), 3),
                        self.tokenizer.decode(s.text_tokens).strip(), None if s.words is None else words(s))
                for s in segments]

    def _align_pending(self) -> None:
        """Time the words of the chunks waiting for it, in one batched decoder pass.

        NOTE: openai-whisper carries the end of the last speech from window to window;
        chunks here finish in any order, so each starts as if speech was last heard at its
        own start (VAD starts a chunk just before speech, after a pause)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        timings = in_halves([p.inputs for p in pending], lambda inputs: align(self.decoder.model, self.tokenizer, inputs),
                            self.decoder.oom_guard, self.decoder.device)
        for item, alignment in zip(pending, timings):
            if alignment is None:            # its words cannot be timed on this device: no partial transcript
                item.file.error = OOM_ROW_ERROR
                continue
            place_words(alignment, item.segments, 0.0)
            raw_text, _ = item.file.chunks[item.chunk.start]
            item.file.chunks[item.chunk.start] = (raw_text, self._file_segments(item.chunk, item.segments))

    def _can_split(self, job: ChunkJob) -> bool:
        return job.depth < MAX_SPLIT_DEPTH and job.chunk.num_samples >= 2 * MIN_SPLIT_S * SAMPLE_RATE
