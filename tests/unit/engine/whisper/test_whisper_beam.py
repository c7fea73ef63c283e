"""BeamSearch against openai-whisper's BeamSearchDecoder and MaximumLikelihoodRanker on
fabricated logits, and the scheduler and cache holding a beam's rows. No model: the
logits of a hypothesis are a pure function of its tokens, so both sides see the same."""

import numpy as np
import pytest
import torch

from engine.whisper.beam import BeamSearch
from engine.whisper.config import WhisperConfig
from engine.whisper.kv_cache import DecoderCache
from engine.whisper.request import DecodeOptions, DecodeRequest
from engine.whisper.scheduler import Scheduler

decoding = pytest.importorskip("whisper.decoding")

VOCAB, EOT, PROMPT = 12, 3, [7, 8]
TINY = WhisperConfig(n_mels=80, n_audio_ctx=4, n_audio_state=8, n_audio_head=2, n_audio_layer=1, n_vocab=51865,
                     n_text_ctx=6, n_text_state=8, n_text_head=2, n_text_layer=1)


def fabricated_logits(sampled: tuple[int, ...], seed: int) -> torch.Tensor:
    """Logits after `sampled`: random per prefix, with <|endoftext|> growing likelier as it
    lengthens, and never first (as SuppressBlank has it; the ranker divides by the length)."""
    generator = torch.Generator().manual_seed(hash((seed, sampled)) % 2**31)
    logits = torch.randn(VOCAB, generator=generator) * 2
    logits[EOT] += len(sampled) - 3 if sampled else float("-inf")
    return logits


class RecordingInference:
    def rearrange_kv_cache(self, source_indices):
        self.sources = source_indices


def openai_beam(beam_size: int, seed: int, max_len: int) -> list[int]:
    decoder = decoding.BeamSearchDecoder(beam_size, EOT, RecordingInference())
    tokens, sum_logprobs = torch.tensor([PROMPT] * beam_size), torch.zeros(beam_size)
    for _ in range(max_len):
        logits = torch.stack([fabricated_logits(tuple(row[len(PROMPT):]), seed) for row in tokens.tolist()])
        tokens, completed = decoder.update(tokens, logits, sum_logprobs)
        if completed:
            break
    candidates, sums = decoder.finalize(tokens.reshape(1, beam_size, -1), sum_logprobs.reshape(1, beam_size))
    candidates = [[t[len(PROMPT):(t == EOT).nonzero()[0, 0]] for t in s] for s in candidates]
    best = decoding.MaximumLikelihoodRanker(None).rank(candidates, sums)[0]
    return candidates[0][best].tolist()


def our_beam(beam_size: int, seed: int, max_len: int) -> list[int]:
    leader = DecodeRequest(0, None, DecodeOptions(beam_size=beam_size), "en")
    beam = BeamSearch.around(leader, EOT)
    for _ in range(max_len):
        logits = torch.stack([fabricated_logits(tuple(row.output), seed) for row in beam.rows])
        beam.advance(beam.candidates(torch.log_softmax(logits, dim=-1)))
        if beam.is_done:
            break
    beam.finish()
    return leader.output


@pytest.mark.parametrize("beam_size", [2, 5])
@pytest.mark.parametrize("max_len", [3, 12])
def test_beam_search_picks_what_openai_whisper_picks(beam_size, max_len):
    for seed in range(20):
        assert our_beam(beam_size, seed, max_len) == openai_beam(beam_size, seed, max_len), seed


def _greedy_beam_greedy(max_slots: int):
    """A scheduler over max_slots slots holding, in order: a greedy request, a 3-beam search, a greedy one."""
    cache = DecoderCache(TINY, max_slots=max_slots, dtype=torch.float32, device=torch.device("cpu"))
    scheduler = Scheduler(cache, max_admit=4)
    greedy = DecodeRequest(0, None, DecodeOptions(), "en")
    beam = BeamSearch.around(DecodeRequest(1, None, DecodeOptions(beam_size=3), "en"), EOT).leader
    last = DecodeRequest(2, None, DecodeOptions(), "en")
    for request in (greedy, beam, last):
        scheduler.add(request)
    return cache, scheduler, greedy, beam, last


def test_a_beam_takes_all_its_slots_or_waits_and_leaves_whole():
    cache, scheduler, greedy, beam, late = _greedy_beam_greedy(max_slots=4)
    assert scheduler.admit(lambda r: True) == [greedy, beam]
    assert scheduler.running == [greedy, *beam.rows] and list(scheduler.waiting) == [late]
    for slot, row in enumerate(scheduler.running):
        row.fed = [0, 0]
        cache.self_k[:, slot, :2] = slot
    scheduler.release([greedy])
    assert scheduler.running == [beam.rows[2], beam.rows[0], beam.rows[1]]
    assert torch.all(cache.self_k[:, 0, :2] == 3)
    scheduler.release([beam])
    assert scheduler.running == [] and scheduler.admit(lambda r: True) == [late]


def test_a_ready_beam_that_does_not_fit_holds_back_the_queue_behind_it():
    _, scheduler, first, beam, behind = _greedy_beam_greedy(max_slots=3)
    assert scheduler.admit(lambda r: True) == [first]
    assert list(scheduler.waiting) == [beam, behind]


def test_reorder_moves_self_rows_as_a_permutation_and_copy_cross_fans_out():
    cache = DecoderCache(TINY, max_slots=3, dtype=torch.float32, device=torch.device("cpu"))
    for slot in range(3):
        cache.self_k[:, slot] = slot
        cache.self_v[:, slot] = 10 + slot
    cache.reorder([0, 1, 2], [1, 0, 0], num_positions=4)
    assert [int(cache.self_k[0, slot, 0, 0]) for slot in range(3)] == [1, 0, 0]
    assert [int(cache.self_v[0, slot, 3, 0]) for slot in range(3)] == [11, 10, 10]
    assert int(cache.self_k[0, 2, 4, 0]) == 2        # rows past num_positions stay
    cache.cross_k[:, 0] = 7
    cache.copy_cross(0, [1, 2])
    assert torch.all(cache.cross_k == 7)


def test_finish_fills_up_from_the_likeliest_live_rows_and_normalises_by_length():
    leader = DecodeRequest(0, None, DecodeOptions(beam_size=2), "en")
    beam = BeamSearch.around(leader, EOT)
    beam.finished[(5, EOT)] = -3.0                  # -3.0 / 1
    beam.rows[0].output, beam.rows[0].sum_logprob = [6, 6, 6, 6], -8.0    # -2.0 per token: wins
    beam.rows[1].output, beam.rows[1].sum_logprob = [9, 9, 9, 9], -9.5
    beam.finish()
    assert leader.output == [6, 6, 6, 6] and leader.sum_logprob == -8.0
    assert np.isclose(leader.avg_logprob, -8.0 / 5)


def test_a_beam_chunk_that_fails_the_checks_falls_back_to_sampling_one_hypothesis(tmp_path):
    """Given a random-weight Whisper, whose text is always too unlikely, and beam_size 3,
    when a file is transcribed, then the first try is a beam at temperature 0 and every
    fallback samples a single hypothesis at the next temperature, as openai-whisper does."""
    from engine.whisper.params import TranscribeParams
    from engine.whisper.transcriber import Transcriber
    from tests.support.random_whisper import random_chunk_decoder

    decoder = random_chunk_decoder(tmp_path, max_slots=4, max_admit=2)
    tried = []
    add = decoder.add
    decoder.add = lambda request, first=False: (tried.append(request.options), add(request, first))
    noise = np.random.default_rng(0).normal(0, 0.1, 16_000 * 3).astype(np.float32)
    params = TranscribeParams(language="en", beam_size=3, vad=False, temperature=[0.0, 0.5])
    [output] = Transcriber(decoder).transcribe([noise], params)
    assert output.error is None
    assert [(o.temperature, o.beam_size) for o in tried[:2]] == [(0.0, 3), (0.5, 1)]
    assert not decoder.has_work and decoder.scheduler.running == []
    with pytest.raises(ValueError, match="beam_size 5 needs 5 decoder slots"):
        Transcriber(decoder).transcribe([noise], TranscribeParams(beam_size=5))
