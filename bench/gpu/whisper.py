"""Issue 23's transcription checks on a GPU, the whisper section of bench/gpu_check.py; each
figure beside its peer from the same run. Random weights of Whisper base's shape (d_model
512, 6 + 6 layers, 8 heads, vocab 51865), built on the device with transformers and saved
as a Hugging Face folder that Barge loads: the same tensors on both sides.

  1. 16 synthetic files of 30-120 s (voiced tones with a syllable-rate envelope, noise,
     pauses), cut into consecutive 30-s windows, each decoded greedily in English without
     timestamps with the same budget of new tokens (stopping early at end-of-text):
     Barge's ChunkDecoder (all windows in its slots, continuous batching, the decoder step
     replayed as CUDA graphs) against transformers' `WhisperForConditionalGeneration.generate`
     on batches of windows (its feature extractor on the device). Audio seconds per second,
     tokens per second and the ratio; fp16 (the GPU default) and fp32 for Barge, fp16 for
     transformers.
  2. CUDA fp32 text against CPU fp32 text: Barge's `Engine.transcribe` on a few short clips
     on both devices, TF32 off; identical texts expected.

    python bench/gpu/whisper.py          # on the GPU machine (bench/gpu_check.py runs it)
    python bench/gpu/whisper.py --cpu    # here: a tiny shape and workload, to exercise the script

NOTE: random weights decode noise, so a window's text is meaningless and where it stops
differs between the two implementations; the token budget bounds the work, and the tokens
each side generated are printed beside the speed. The transcriber's quality fallbacks
(hotter retries, re-chunking) are left out of (1): with random weights every window would
fail them, and the peer has none. Nothing is asserted but (2) (exit status 1 when the
texts differ): speed is read, not tested.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(os.environ.get("BARGE_ROOT", Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

SAMPLE_RATE = 16_000
WINDOW_SAMPLES = 30 * SAMPLE_RATE
BASE = dict(vocab_size=51865, d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
            decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048, num_mel_bins=80,
            max_source_positions=1500, max_target_positions=448)
TINY = dict(BASE, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=256, decoder_ffn_dim=256)
TARGETS = "issue 23 targets on an H200: fp16 >= fp32 on CUDA; >= 5x the peer's audio s/s; CUDA fp32 text = CPU fp32"


@dataclass(frozen=True)
class Scale:
    num_files: int
    file_seconds: tuple[int, int]
    token_budget: int             # new tokens per window, at most
    peer_batch: int               # windows per transformers generate call
    num_parity_clips: int
    parity_seconds: int


GPU_SCALE = Scale(16, (30, 120), 64, 16, 3, 8)
CPU_SCALE = Scale(2, (30, 40), 6, 4, 2, 4)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="a tiny shape and workload on CPU")
    args = parser.parse_args()
    on_gpu = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda" if on_gpu else "cpu")
    scale, shape = (GPU_SCALE, BASE) if on_gpu else (CPU_SCALE, TINY)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False          # the encoder's convolutions, for (2)
    with tempfile.TemporaryDirectory() as work:
        folder = random_whisper_folder(Path(work), shape)
        files = synthetic_files(scale)
        windows = [w for audio in files for w in cut_windows(audio)]
        audio_s = sum(len(audio) for audio in files) / SAMPLE_RATE
        print(f"device {device_name(device)}; shape d_model {shape['d_model']}, {shape['decoder_layers']} layers; "
              f"{len(files)} files, {audio_s:.0f} s of audio, {len(windows)} windows, "
              f"budget {scale.token_budget} tokens per window", flush=True)
        dtypes = [torch.float16, torch.float32] if on_gpu else [torch.float32]
        barge = {dtype: run_barge(folder, windows, scale, dtype, device) for dtype in dtypes}
        peer = run_peer(folder, windows, scale, dtypes[0], device)
        report_speed(barge, peer, audio_s, dtypes)
        same = check_cpu_text(folder, scale, device)
    print(TARGETS)
    return 0 if same else 1


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def random_whisper_folder(work: Path, shape: dict) -> Path:
    """A Hugging Face Whisper folder of random weights (seed 0) with tiny.en's tokenizer text."""
    import transformers
    folder = work / "whisper-random"
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**shape))
    model.save_pretrained(folder)
    (folder / "tokenizer.json").write_bytes(tokenizer_json().read_bytes())
    return folder


def tokenizer_json() -> Path:
    prepared = ROOT / "gpu_inputs" / "whisper-tok" / "tokenizer.json"
    if prepared.exists():
        return prepared
    from tests.support.whisper_models import tiny_en_path
    return Path(tiny_en_path()) / "tokenizer.json"


def synthetic_files(scale: Scale, seed: int = 0) -> list[np.ndarray]:
    """Voiced tones (a pitch and its harmonics under a 3-6 Hz syllable envelope) between pauses, in noise."""
    rng = np.random.default_rng(seed)
    files = []
    for _ in range(scale.num_files):
        num_samples = int(rng.uniform(*scale.file_seconds) * SAMPLE_RATE)
        t = np.arange(num_samples) / SAMPLE_RATE
        pitch = rng.uniform(90, 260) * (1 + 0.05 * np.sin(2 * np.pi * 0.3 * t))
        phase = 2 * np.pi * np.cumsum(pitch) / SAMPLE_RATE
        voiced = sum(np.sin(k * phase) / k for k in range(1, 6))
        envelope = np.clip(np.sin(2 * np.pi * rng.uniform(3, 6) * t), 0, None)
        talking = (np.sin(2 * np.pi * t / rng.uniform(4, 9)) > -0.3).astype(np.float64)    # pauses
        audio = 0.1 * voiced * envelope * talking + 0.005 * rng.standard_normal(num_samples)
        files.append(audio.astype(np.float32))
    return files


def cut_windows(audio: np.ndarray) -> list[np.ndarray]:
    return [audio[start:start + WINDOW_SAMPLES] for start in range(0, len(audio), WINDOW_SAMPLES)]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_barge(folder: Path, windows: list[np.ndarray], scale: Scale, dtype: torch.dtype,
              device: torch.device) -> tuple[float, int]:
    """(seconds, tokens generated) for every window through one ChunkDecoder, after a warm-up
    pass over the same windows (it captures the CUDA graphs of the buckets it meets)."""
    from engine import Engine
    from engine.whisper.request import DecodeOptions, DecodeRequest
    decoder = Engine.from_pretrained(folder, mode="transcribe", device=str(device), dtype=dtype).transcriber.decoder
    options = DecodeOptions(with_timestamps=False, max_new_tokens=scale.token_budget)

    def decode_all() -> tuple[float, int]:
        requests = [DecodeRequest(index, lambda window=window: window, options, "en")
                    for index, window in enumerate(windows)]
        synchronize(device)
        started = time.perf_counter()
        for request in requests:
            decoder.add(request)
        while decoder.has_work:
            decoder.step()
        synchronize(device)
        # The sampled tokens, and the <|endoftext|> of those that stopped before the budget.
        return time.perf_counter() - started, sum(len(r.output) + (len(r.output) < scale.token_budget)
                                                  for r in requests)

    decode_all()
    seconds, tokens = decode_all()
    graphs = decoder.decoder_step.num_graphs
    print(f"  barge {str(dtype)[6:]}: {seconds:.2f} s, {tokens} tokens, max_admit {decoder.scheduler.max_admit}, "
          f"{graphs} CUDA graphs", flush=True)
    return seconds, tokens


def run_peer(folder: Path, windows: list[np.ndarray], scale: Scale, dtype: torch.dtype,
             device: torch.device) -> tuple[float, int]:
    """transformers on the same weights: its feature extractor (on the device) and greedy
    generate on batches of windows, forced to <|startoftranscript|><|en|><|transcribe|>
    <|notimestamps|>, the same budget, stopping at <|endoftext|>."""
    import transformers
    from engine.whisper.tokenizer import WhisperTokenizer
    from engine.whisper.loader import load_checkpoint
    tokenizer = WhisperTokenizer(load_checkpoint(folder).config, folder)
    model = transformers.WhisperForConditionalGeneration.from_pretrained(folder, dtype=dtype).to(device).eval()
    extractor = transformers.WhisperFeatureExtractor(feature_size=model.config.num_mel_bins)
    prompt = torch.tensor([tokenizer.sot_sequence("en", "transcribe", with_timestamps=False)], device=device)

    def generate_all() -> tuple[float, int]:
        synchronize(device)
        started, tokens = time.perf_counter(), 0
        for first in range(0, len(windows), scale.peer_batch):
            batch = windows[first:first + scale.peer_batch]
            features = extractor(batch, sampling_rate=SAMPLE_RATE, return_tensors="pt",
                                 device=device.type).input_features.to(device=device, dtype=dtype)
            with torch.inference_mode():
                out = transformers.GenerationMixin.generate(
                    model, input_features=features, decoder_input_ids=prompt.repeat(len(batch), 1),
                    max_new_tokens=scale.token_budget, do_sample=False, num_beams=1,
                    eos_token_id=tokenizer.eot, pad_token_id=tokenizer.eot)
            tokens += count_generated(out[:, prompt.shape[1]:], tokenizer.eot)
        synchronize(device)
        return time.perf_counter() - started, tokens

    generate_all()
    seconds, tokens = generate_all()
    print(f"  transformers {str(dtype)[6:]}: {seconds:.2f} s, {tokens} tokens, batches of {scale.peer_batch}",
          flush=True)
    return seconds, tokens


def count_generated(new_tokens: torch.Tensor, eot: int) -> int:
    """Tokens each row generated up to and including its first <|endoftext|> (the rest is padding)."""
    is_eot = new_tokens == eot
    lengths = torch.where(is_eot.any(dim=1), is_eot.int().argmax(dim=1) + 1, new_tokens.shape[1])
    return int(lengths.sum())


def report_speed(barge: dict, peer: tuple[float, int], audio_s: float, dtypes: list[torch.dtype]) -> None:
    peer_seconds, peer_tokens = peer
    peer_rate = audio_s / peer_seconds
    print(f"RESULT transformers {str(dtypes[0])[6:]}: {peer_rate:,.1f} audio s/s, {peer_tokens / peer_seconds:,.0f} tok/s")
    for dtype, (seconds, tokens) in barge.items():
        print(f"RESULT barge {str(dtype)[6:]}: {audio_s / seconds:,.1f} audio s/s, {tokens / seconds:,.0f} tok/s, "
              f"{audio_s / seconds / peer_rate:.2f}x transformers {str(dtypes[0])[6:]}")
    if len(barge) == 2:
        fp16, fp32 = (barge[dtype][0] for dtype in dtypes)
        print(f"RESULT barge fp16 / fp32 speed: {fp32 / fp16:.2f}x")


def check_cpu_text(folder: Path, scale: Scale, device: torch.device) -> bool:
    """Barge's transcribe in fp32 on the device and on the CPU: the same texts."""
    from engine import Engine
    rng = np.random.default_rng(1)
    t = np.arange(scale.parity_seconds * SAMPLE_RATE) / SAMPLE_RATE
    clips = [(0.1 * np.sin(2 * np.pi * (200 + 50 * i) * t) + 0.01 * rng.standard_normal(t.size)).astype(np.float32)
             for i in range(scale.num_parity_clips)]
    params = dict(language="en", temperature=(0.0,), vad=False, with_timestamps=False)
    texts = {}
    for where in dict.fromkeys(["cpu", device.type]):
        engine = Engine.from_pretrained(folder, mode="transcribe", device=where, dtype=torch.float32)
        texts[where] = [output.text for output in engine.transcribe(clips, **params)]
    same = sum(a == b for a, b in zip(texts["cpu"], texts[device.type]))
    print(f"RESULT {device.type} fp32 texts identical to cpu fp32: {same}/{len(clips)} "
          f"(first: {texts[device.type][0][:50]!r})")
    return same == len(clips)


if __name__ == "__main__":
    sys.exit(main())
