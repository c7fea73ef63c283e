"""The decoder step CUDA runs (static buffers per slot-count bucket, a fixed attention
length, CUDA graphs) against the eager step the CPU runs, on a random Whisper.

On CPU the static step runs with capture off: the same tokens as the eager step, and one
self-attention shape per bucket however long the decode (issue 23: in fp16 on CUDA each new
shape cost a cuDNN plan, one per step). The graph tests run where CUDA is."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from engine.whisper.config import WhisperConfig
from engine.whisper.decoder_step import DecoderStep, attention_backends, slot_buckets
from engine.whisper.decoding import ChunkDecoder
from engine.whisper.logit_rules import LogitRules
from engine.whisper.model import Whisper
from engine.whisper.request import DecodeOptions, DecodeRequest
from engine.whisper.tokenizer import WhisperTokenizer

SMALL = WhisperConfig(n_mels=80, n_audio_ctx=1500, n_audio_state=16, n_audio_head=2, n_audio_layer=1,
                      n_vocab=51865, n_text_ctx=24, n_text_state=16, n_text_head=2, n_text_layer=2)


def small_decoder(folder, device: str = "cpu", dtype=torch.float32, is_static: bool = False,
                  use_graphs: bool = False, max_slots: int = 3) -> ChunkDecoder:
    (folder / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {}, "merges": []}}')
    torch.manual_seed(0)
    model = Whisper(SMALL).eval().to(device=device, dtype=dtype)
    tokenizer = WhisperTokenizer(SMALL, folder)
    decoder = ChunkDecoder(model, tokenizer, LogitRules(tokenizer, (), ()), max_slots, max_admit=2)
    decoder.decoder_step = DecoderStep(model, decoder.cache, is_static=is_static, use_graphs=use_graphs)
    return decoder


def noise_requests(count: int) -> list[DecodeRequest]:
    """Chunks of different noise and token budgets, so they finish at different steps and
    the running count (the bucket) changes as slots free and refill."""
    rng = np.random.default_rng(7)
    clips = [(0.1 * rng.standard_normal(16_000 * (1 + index % 3))).astype(np.float32) for index in range(count)]
    return [DecodeRequest(index, lambda clip=clip: clip, DecodeOptions(with_timestamps=False,
                                                                         max_new_tokens=4 + 3 * index), "en")
            for index, clip in enumerate(clips)]


def decode_all(decoder: ChunkDecoder, requests: list[DecodeRequest]) -> list[list[int]]:
    for request in requests:
        decoder.add(request)
    while decoder.has_work:
        decoder.step()
    return [request.output for request in requests]


def test_slot_buckets_are_powers_of_two_up_to_max_slots():
    assert slot_buckets(1) == (1,)
    assert slot_buckets(3) == (1, 2, 3)
    assert slot_buckets(64) == (1, 2, 4, 8, 16, 32, 64)


def test_the_cpu_decoder_steps_eagerly_as_before(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {}, "merges": []}}')
    model = Whisper(SMALL).eval()
    tokenizer = WhisperTokenizer(SMALL, tmp_path)
    decoder = ChunkDecoder(model, tokenizer, LogitRules(tokenizer, (), ()), 3, 2)
    assert not decoder.decoder_step.is_static and not decoder.decoder_step.use_graphs
    with pytest.raises(ValueError, match="use_graphs needs is_static"):
        DecoderStep(model, decoder.cache, is_static=False, use_graphs=True)


def test_the_static_step_gives_the_eager_steps_tokens(tmp_path):
    eager = decode_all(small_decoder(tmp_path), noise_requests(6))
    static_decoder = small_decoder(tmp_path, is_static=True)
    static = decode_all(static_decoder, noise_requests(6))
    assert static == eager
    assert sum(len(tokens) for tokens in eager) > 6 * 4       # they ran, past the forced tokens
    assert set(static_decoder.decoder_step._buffers) == {1, 2, 3}    # every bucket was used


def test_the_static_step_logits_match_the_eager_step_at_every_position(tmp_path):
    """Pad slots and the masked rows past each slot's position change nothing."""
    eager, static = small_decoder(tmp_path), small_decoder(tmp_path, is_static=True, max_slots=4)
    features = eager.encode([np.full(16_000, 0.05, dtype=np.float32), np.zeros(8_000, dtype=np.float32)])
    with torch.inference_mode():
        for decoder in (eager, static):
            decoder.model.decoder.write_cross(decoder.cache, [0, 1], features)
        for position in range(SMALL.n_text_ctx):
            tokens, positions = [50257 + position, 400 + position], [position, position]
            theirs, ours = eager.decoder_step(tokens, positions), static.decoder_step(tokens, positions)
            assert ours.shape == theirs.shape == (2, SMALL.n_vocab)
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_static_step_attends_one_shape_per_bucket_however_long_the_decode(tmp_path, monkeypatch, dtype):
    """Issue 23: the eager step's self-attention keys grow one position per step, a new
    shape each step, and each new shape cost a cuDNN plan in fp16 on CUDA."""
    shapes = set()
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, **kwargs):
        if attn_mask is not None and q.shape[-2] == 1:          # the decoder step's self-attention
            shapes.add((tuple(q.shape), tuple(k.shape), tuple(attn_mask.shape)))
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    decoder = small_decoder(tmp_path, dtype=dtype, is_static=True)
    outputs = decode_all(decoder, noise_requests(6))
    assert max(len(tokens) for tokens in outputs) >= 10
    assert len(shapes) == len(decoder.decoder_step._buffers) == 3
    assert {k[2] for _, k, _ in shapes} == {SMALL.n_text_ctx}


def test_attention_backends_leave_the_cpu_alone():
    q = torch.randn(1, 2, 1, 8)
    with attention_backends(torch.device("cpu")):
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    assert torch.equal(out, torch.nn.functional.scaled_dot_product_attention(q, q, q))


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
def test_cuda_graph_replays_give_the_static_steps_tokens(tmp_path):
    eager = decode_all(small_decoder(tmp_path, device="cuda", is_static=True), noise_requests(6))
    graphed_decoder = small_decoder(tmp_path, device="cuda", is_static=True, use_graphs=True)
    assert decode_all(graphed_decoder, noise_requests(6)) == eager
    assert graphed_decoder.decoder_step.num_graphs == 3


@cuda
def test_cuda_fp16_decoding_builds_no_cudnn_attention_plans(tmp_path):
    decoder = small_decoder(tmp_path, device="cuda", dtype=torch.float16, is_static=True, use_graphs=False)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        decode_all(decoder, noise_requests(4))
    names = {event.key for event in profile.key_averages()}
    assert "aten::scaled_dot_product_attention" in names
    assert not [name for name in names if "cudnn_attention" in name]


def test_the_encoder_batch_fills_half_the_free_memory_up_to_the_slots():
    from engine.whisper.build import max_encoder_batch
    base = WhisperConfig(n_mels=80, n_audio_ctx=1500, n_audio_state=512, n_audio_head=8, n_audio_layer=6,
                         n_vocab=51865, n_text_ctx=448, n_text_state=512, n_text_head=8, n_text_layer=6)
    one_gib = 1 << 30
    sizes = [max_encoder_batch(base, 2, free * one_gib, 64) for free in (0, 1, 4, 8, 60)]
    assert sizes[0] == 1 and sizes[-1] == 64                   # at least one; never more than the slots
    assert sizes == sorted(sizes) and 1 < sizes[2] < sizes[3] < 64
    assert max_encoder_batch(base, 4, 8 * one_gib, 64) < sizes[3]     # fp32 activations take more


@pytest.mark.parametrize("vad", [True, False])
def test_files_streamed_in_as_read_decode_as_files_read_first(tmp_path, monkeypatch, vad):
    """CUDA starts decoding the first files while later ones are still being read; the
    transcripts (and a bad file's error, in its place) are those of reading them all first."""
    from engine.whisper.params import TranscribeParams
    from engine.whisper.transcriber import Transcriber
    rng = np.random.default_rng(3)
    files = [(0.2 * rng.standard_normal(16_000 * seconds)).astype(np.float32) for seconds in (3, 40, 1, 7)]
    files.insert(2, b"not audio")
    params = TranscribeParams(language="en", vad=vad)
    read_first = Transcriber(small_decoder(tmp_path)).transcribe(files, params)
    monkeypatch.setattr(Transcriber, "_streams_files", property(lambda self: True))
    steps_when_read = []
    open_file = Transcriber._open

    def slow_open(self, source, language):
        """The other files are read only once the first one decodes (or after 30 s)."""
        deadline = time.monotonic() + 30
        while source is not files[0] and self.decoder.num_steps == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        steps_when_read.append(self.decoder.num_steps)
        return open_file(self, source, language)

    monkeypatch.setattr(Transcriber, "_open", slow_open)
    streamed = Transcriber(small_decoder(tmp_path)).transcribe(files, params)
    assert streamed == read_first
    assert streamed[2].error and not streamed[0].error and streamed[1].duration_s == 40.0
    assert sorted(steps_when_read)[1] > 0     # the first file was decoding while the others were read
