"""Pure pieces of the transcription engine: audio blocks, segments from timestamp
tokens, the slot scheduler, parameters, the CTranslate2 reader, the tokenizer's ids."""

import re
import struct

import numpy as np
import pytest
import torch

from engine.whisper.audio import BLOCK_SAMPLES, Audio, AudioError, load_audio
from engine.whisper.config import WhisperConfig
from engine.whisper.ct2 import read_ct2
from engine.whisper.kv_cache import DecoderCache
from engine.whisper.logit_rules import compression_ratio
from engine.whisper.outputs import Segment
from engine.whisper.params import TranscribeParams
from engine.whisper.request import DecodeOptions, DecodeRequest
from engine.whisper.scheduler import Scheduler
from engine.whisper.segments import chunk_segments
from engine.whisper.tokenizer import LANGUAGE_CODES, WhisperTokenizer

TINY = WhisperConfig(n_mels=80, n_audio_ctx=4, n_audio_state=8, n_audio_head=2, n_audio_layer=1, n_vocab=51865,
                     n_text_ctx=6, n_text_state=8, n_text_head=2, n_text_layer=1)


class FakeTokenizer:
    timestamp_begin, eot = 50364, 50257

    def decode(self, ids):
        return "".join(f" w{i}" for i in ids if i < self.eot)


def test_audio_blocks_keep_silence_as_nothing_and_read_back_exactly():
    samples = np.zeros(3 * BLOCK_SAMPLES + 100, dtype=np.float32)
    samples[BLOCK_SAMPLES + 5] = 0.5
    samples[-1] = -0.25
    audio = Audio.from_array(samples)
    assert [block is None for block in audio.blocks] == [True, False, True, False]
    assert np.array_equal(audio.samples(0, audio.num_samples), samples)
    assert np.array_equal(audio.samples(BLOCK_SAMPLES, BLOCK_SAMPLES + 10), samples[BLOCK_SAMPLES:BLOCK_SAMPLES + 10])


@pytest.mark.parametrize("source, message", [
    (None, "audio is null"), (b"", "audio is empty (0 bytes)"), (12, "not int"),
    (np.zeros((2, 10), np.float32), "1-D"), (np.zeros(10, np.int16), "floats"),
    (np.zeros(0, np.float32), "no samples"), (b"RIFF....WAVEfmt garbage", "not decodable"),
])
def test_unusable_audio_is_an_audio_error_saying_why(source, message):
    with pytest.raises(AudioError, match=re.escape(message)):
        load_audio(source)


def test_segments_open_and_close_on_timestamps_on_the_file_time_line():
    tok = FakeTokenizer()
    ts = lambda seconds: tok.timestamp_begin + round(seconds / 0.02)   # noqa: E731
    tokens = [ts(0.0), 1, 2, ts(1.5), ts(1.5), 3, ts(2.0), ts(2.5), 4]
    assert chunk_segments(tokens, tok, offset_s=10.0, duration_s=4.0) == [
        Segment(10.0, 11.5, "w1 w2"), Segment(11.5, 12.0, "w3"), Segment(12.5, 14.0, "w4")]
    assert chunk_segments([5, 6], tok, 0.0, 3.0) == [Segment(0.0, 3.0, "w5 w6")]
    assert chunk_segments([ts(0.0), 1, ts(40.0)], tok, 0.0, 3.0) == [Segment(0.0, 3.0, "w1")]


def _request(request_id: int, position: int = 0) -> DecodeRequest:
    request = DecodeRequest(request_id, None, DecodeOptions(), "en")
    request.fed = [0] * position
    return request


def test_scheduler_admits_into_free_slots_and_compacts_on_release():
    cache = DecoderCache(TINY, max_slots=3, dtype=torch.float32, device=torch.device("cpu"))
    scheduler = Scheduler(cache, max_admit=2)
    requests = [_request(i, position=i + 1) for i in range(5)]
    for request in requests:
        scheduler.add(request)
    assert scheduler.admit(lambda r: True) == requests[:2]
    assert scheduler.admit(lambda r: r.request_id != 2) == [requests[3]]     # not ready: stays queued, in order
    for slot, request in enumerate(scheduler.running):
        cache.cross_k[:, slot] = request.request_id
        cache.self_k[:, slot, :request.position] = request.request_id
    scheduler.release([requests[0]])
    assert scheduler.running == [requests[3], requests[1]]
    assert torch.all(cache.cross_k[:, 0] == 3) and torch.all(cache.self_k[:, 0, :4] == 3)
    scheduler.release([requests[1], requests[3]])
    assert scheduler.running == [] and [r.request_id for r in scheduler.waiting] == [2, 4]
    scheduler.add(_request(9), first=True)
    assert scheduler.waiting[0].request_id == 9


def test_a_request_waits_for_its_files_language():
    first = DecodeRequest(0, None, DecodeOptions(), None)
    later = DecodeRequest(1, None, DecodeOptions(), None, language_from=first)
    assert first.is_ready and not later.is_ready
    first.language = "de"
    assert later.is_ready


@pytest.mark.parametrize("kwargs, message", [
    ({"task": "summarize"}, "task must be one of"), ({"temperature": -0.1}, "temperature must be"),
    ({"temperature": [0.0, "hot"]}, "temperature must be"),
    ({"beam_size": 0}, "beam_size must be an integer from 1"), ({"beam_size": 17}, "beam_size must be an integer"),
    ({"beam_size": 2.0}, "beam_size must be"), ({"beam_size": True}, "beam_size must be"),
    ({"vad": "yes"}, "vad must be a boolean"), ({"language": 3}, "language must be"),
    ({"language": "klingon"}, "language must be a language code"),
])
def test_bad_parameters_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TranscribeParams(**kwargs)


def test_beams_decode_at_temperature_zero_and_fallbacks_sample():
    params = TranscribeParams(beam_size=5)
    assert [params.beam_size_at(t) for t in params.temperatures[:2]] == [5, 1]
    with pytest.raises(ValueError, match="temperature 0 only"):
        DecodeOptions(beam_size=5, temperature=0.2)


def test_temperature_fallbacks():
    assert TranscribeParams().temperatures == (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    assert TranscribeParams(temperature=0.6).temperatures == (0.6, 0.8, 1.0)
    assert TranscribeParams(temperature=[0.0, 0.5]).temperatures == (0.0, 0.5)


def test_compression_ratio_flags_loops():
    assert compression_ratio("the the the the the the the the the the the the the the") > 2.4
    assert compression_ratio("A barge moves slowly down the wide river at night.") < 2.4
    assert compression_ratio("") == 0.0


def _ct2_bytes(variables: dict[str, np.ndarray], aliases=()) -> bytes:
    def string(text):
        data = text.encode() + b"\0"
        return struct.pack("<H", len(data)) + data
    out = struct.pack("<I", 6) + string("WhisperSpec") + struct.pack("<II", 3, len(variables))
    for name, array in variables.items():
        dtype_id = {np.dtype(np.float32): 0, np.dtype(np.float16): 4, np.dtype(np.int8): 1}[array.dtype]
        out += string(name) + struct.pack("<B", array.ndim) + b"".join(struct.pack("<I", d) for d in array.shape)
        out += struct.pack("<BI", dtype_id, array.nbytes) + array.tobytes()
    out += struct.pack("<I", len(aliases)) + b"".join(string(a) + string(t) for a, t in aliases)
    return out


def test_ct2_reader_reads_variables_and_aliases_and_refuses_truncation(tmp_path):
    weight = np.arange(6, dtype=np.float16).reshape(2, 3)
    path = tmp_path / "model.bin"
    path.write_bytes(_ct2_bytes({"a/weight": weight, "flag": np.array(1, np.int8)}, [("b/weight", "a/weight")]))
    name, variables = read_ct2(path)
    assert name == "WhisperSpec" and np.array_equal(variables["b/weight"], weight)
    assert variables["a/weight"].dtype == np.float16 and int(variables["flag"]) == 1
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(ValueError, match="truncated"):
        read_ct2(path)


def test_special_token_ids_follow_from_the_vocabulary_size(tmp_path):
    whisper_tokenizer = pytest.importorskip("whisper.tokenizer")
    assert list(LANGUAGE_CODES) == list(whisper_tokenizer.LANGUAGES)
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {}, "merges": []}}')
    for n_vocab, multilingual, num_languages in ((51865, True, 99), (51866, True, 100), (51864, False, 99)):
        ours = WhisperTokenizer(WhisperConfig(**{**TINY.__dict__, "n_vocab": n_vocab}), tmp_path)
        theirs = whisper_tokenizer.get_tokenizer(multilingual, num_languages=num_languages)
        for name in ("eot", "sot", "transcribe", "translate", "sot_prev", "sot_lm", "no_speech", "no_timestamps",
                     "timestamp_begin"):
            assert getattr(ours, name) == getattr(theirs, name), (n_vocab, name)
        assert ours.language_ids["en"] == theirs.to_language_token("en")
        if multilingual:
            assert ours.sot_sequence("de", "translate", True) == list(
                whisper_tokenizer.get_tokenizer(True, num_languages=num_languages, language="de",
                                                task="translate").sot_sequence)
