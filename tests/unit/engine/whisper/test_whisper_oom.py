"""Out of memory in a transcription step (issue 30): the real torch.OutOfMemoryError,
raised by engine.oom's test hook before an encoder batch or decoder step of more rows than
it allows, is survived — the chunks start over under lowered budgets and give the tokens
of a run without the hook — and only a chunk that does not fit alone becomes an error,
its file an error row, with the other files transcribed."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from engine.oom import INJECT_VARIABLE, OOM_ROW_ERROR
from engine.whisper.params import TranscribeParams
from engine.whisper.request import DecodeOptions, DecodeRequest
from engine.whisper.transcriber import Transcriber
from tests.unit.engine.whisper.test_whisper_decoder_step import decode_all, noise_requests, small_decoder


def noise_files(seconds: tuple[int, ...]) -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    return [(0.2 * rng.standard_normal(16_000 * length)).astype(np.float32) for length in seconds]


def test_a_decoder_step_out_of_memory_puts_chunks_back_and_gives_the_same_tokens(tmp_path, monkeypatch):
    expected = decode_all(small_decoder(tmp_path, max_slots=6), noise_requests(8))
    monkeypatch.setenv(INJECT_VARIABLE, "2")      # any step of more than 2 rows runs out of memory
    decoder = small_decoder(tmp_path, max_slots=6)
    decoder.scheduler.max_admit = 2               # the encoder batches fit; the decoder's 4+ rows do not
    assert decode_all(decoder, noise_requests(8)) == expected
    assert decoder.scheduler.max_running == 2 and decoder.oom_guard.num_ooms >= 1
    assert decoder.settings["num_oom_retries"] == decoder.oom_guard.num_ooms
    assert decoder.settings["max_running"] == 2 and not decoder.has_work


def test_chunks_put_back_mid_decode_start_over_and_give_the_same_tokens(tmp_path):
    """The memory runs out only once every slot's chunk has sampled tokens of its own:
    the chunks put back drop them and decode from their first forced token again."""
    expected = decode_all(small_decoder(tmp_path, max_slots=6), noise_requests(8))
    decoder = small_decoder(tmp_path, max_slots=6)
    decoder.scheduler.max_admit = 6
    requests = noise_requests(8)
    for request in requests:
        decoder.add(request)
    for _ in range(6):          # 4 forced tokens, then 2 sampled by each of the 6 running chunks
        decoder.step()
    assert len(decoder.scheduler.running) == 6 and all(len(r.output) >= 1 for r in decoder.scheduler.running)
    decoder.oom_guard.inject_above_tokens = 2
    while decoder.has_work:
        decoder.step()
    assert [request.output for request in requests] == expected
    assert decoder.scheduler.max_running == 1 and decoder.oom_guard.num_ooms == 2    # 6 -> 3 -> 1 rows


def test_an_encoder_batch_out_of_memory_lowers_max_admit_and_gives_the_same_tokens(tmp_path, monkeypatch):
    expected = decode_all(small_decoder(tmp_path, max_slots=3), noise_requests(5))
    monkeypatch.setenv(INJECT_VARIABLE, "1")
    decoder = small_decoder(tmp_path, max_slots=3)
    decoder.scheduler.max_admit = 3               # the first step encodes 3 chunks at once: out of memory
    finished = decode_all(decoder, noise_requests(5))
    assert finished == expected
    assert decoder.scheduler.max_admit == 1 and decoder.scheduler.max_running == 1
    assert decoder.oom_guard.num_ooms >= 2        # the encoder's, then a decoder step's of 2 rows


def test_a_chunk_that_does_not_fit_alone_finishes_with_the_error_and_its_slot_is_freed(tmp_path, monkeypatch):
    monkeypatch.setenv(INJECT_VARIABLE, "0")
    decoder = small_decoder(tmp_path, max_slots=3)
    requests = noise_requests(3)
    for request in requests:
        decoder.add(request)
    finished = []
    while decoder.has_work:
        finished += decoder.step()
    assert sorted(r.request_id for r in finished) == [0, 1, 2]
    assert all(r.error == OOM_ROW_ERROR and r.is_finished for r in finished)
    assert decoder.scheduler.running == [] and decoder.scheduler.max_admit == 1


def test_a_restarted_request_forgets_its_tokens_and_a_language_it_detected():
    request = DecodeRequest(0, None, DecodeOptions(temperature=0.5), None)
    request.fed, request.output, request.sum_logprob = [1, 2, 3], [3], -1.5
    request.language, request.language_probs = "de", {"de": 0.9, "en": 0.1}
    request.generator = torch.Generator()
    request.restart()
    assert (request.fed, request.output, request.sum_logprob, request.generator) == ([], [], 0.0, None)
    assert request.language is None and request.language_probs is None and request.position == 0
    given = DecodeRequest(1, None, DecodeOptions(), "en")
    given.restart()
    assert given.language == "en"


@pytest.mark.parametrize("beam_size", [1, 2])
def test_transcripts_under_out_of_memory_steps_equal_those_without(tmp_path, monkeypatch, beam_size):
    """Files of several windows through the Transcriber, greedy and with a beam: every
    transcript equals the run without the hook, and nothing is left running."""
    files = noise_files((3, 40, 7, 65))
    params = TranscribeParams(language="en", vad=False, beam_size=beam_size, temperature=[0.0])
    expected = Transcriber(small_decoder(tmp_path, max_slots=6)).transcribe(files, params)
    monkeypatch.setenv(INJECT_VARIABLE, "2")
    decoder = small_decoder(tmp_path, max_slots=6)
    outputs = Transcriber(decoder).transcribe(files, params)
    assert outputs == expected and all(output.error is None for output in outputs)
    assert decoder.oom_guard.num_ooms >= 1 and not decoder.has_work


def test_a_file_whose_chunk_cannot_fit_alone_is_an_error_row_and_the_rest_decode(tmp_path, monkeypatch):
    """Language detection is off (given), so every chunk is admitted alone at the floor and
    fails: each file is an error row with the out-of-memory message, a bad file keeps its own
    error, and no queued chunk of a failed file is left behind."""
    files = noise_files((3, 70))
    files.insert(1, b"not audio")
    monkeypatch.setenv(INJECT_VARIABLE, "0")
    decoder = small_decoder(tmp_path, max_slots=3)
    outputs = Transcriber(decoder).transcribe(files, TranscribeParams(language="en", vad=False))
    assert [output.error for output in outputs] == [OOM_ROW_ERROR, outputs[1].error, OOM_ROW_ERROR]
    assert outputs[1].error != OOM_ROW_ERROR and outputs[0].text is None and outputs[2].duration_s == 70.0
    assert not decoder.has_work


def test_language_detection_and_word_timing_split_their_batches_and_give_the_same_output(tmp_path, monkeypatch):
    """Detection (language None) and word timing take every file or chunk at once; under the
    hook they run in halves down to one item, and the output equals the run without it."""
    files = noise_files((3, 40, 7))
    params = TranscribeParams(language=None, vad=False, word_timestamps=True, temperature=[0.0])
    expected = Transcriber(small_decoder(tmp_path, max_slots=3)).transcribe(files, params)
    assert all(output.language_probability is not None for output in expected)
    monkeypatch.setenv(INJECT_VARIABLE, "1")
    decoder = small_decoder(tmp_path, max_slots=3)
    outputs = Transcriber(decoder).transcribe(files, params)

    def rounded(output):      # the encoder's batch of 1 against 3 moves a probability by ~1e-7
        return dataclasses.replace(output, language_probability=round(output.language_probability, 5))
    assert [rounded(o) for o in outputs] == [rounded(o) for o in expected]
    assert all(output.error is None for output in outputs) and decoder.oom_guard.num_ooms >= 2


def test_in_halves_splits_down_to_single_items_and_marks_those_that_do_not_fit():
    from engine.oom import OomGuard, in_halves
    seen = []

    def run(batch):
        seen.append(list(batch))
        if sum(batch) > 5:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return [item * 10 for item in batch]

    guard = OomGuard()
    assert in_halves([1, 2, 3, 9, 1], run, guard, torch.device("cpu")) == [10, 20, 30, None, 10]
    assert seen[0] == [1, 2, 3, 9, 1] and [9] in seen and guard.num_ooms == 4    # 5, 3, then 2 items, then 9 alone
    assert in_halves([], run, guard, torch.device("cpu")) == []
