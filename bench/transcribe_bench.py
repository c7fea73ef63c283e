"""Transcription speed: Barge's engine beside openai-whisper's `transcribe`, same process,
same weights (the real Whisper base), same CPU threads.

    .venv/bin/python bench/transcribe_bench.py                  # 30 minutes of speech
    .venv/bin/python bench/transcribe_bench.py --minutes 5 --threads 1

The corpus is espeak-ng speech of known sentences in files of mixed length (10 s to
3 min, sentences joined by 0.3–3 s pauses). Both sides get the same 16 kHz arrays and
their defaults: language detected, timestamps, temperature fallback; openai-whisper
decodes one file at a time (fp32), Barge all files at once. Prints each side's
real-time factor (processing seconds per audio second), the speed ratio, and each
side's word error rate against the known text as a check that both did the work.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tests.support.speech import SENTENCES, espeak, silence, word_error_rate  # noqa: E402
from tests.support.whisper_models import base_path, openai_reference  # noqa: E402

SAMPLE_RATE = 16_000


def build_corpus(total_s: float, seed: int = 0) -> list[tuple[np.ndarray, str]]:
    """(audio, reference text) files of 10 s .. 3 min until total_s seconds of audio."""
    rng = random.Random(seed)
    spoken = {sentence: espeak(sentence) for sentence in SENTENCES}
    files, total = [], 0.0
    while total < total_s:
        target_s = min(rng.choice([10, 20, 45, 90, 180]), max(10.0, total_s - total))
        parts, words, length = [silence(rng.uniform(0.2, 1.0))], [], 0.0
        while length < target_s:
            sentence = rng.choice(SENTENCES)
            parts += [spoken[sentence], silence(rng.uniform(0.3, 3.0))]
            words.append(sentence)
            length = sum(len(p) for p in parts) / SAMPLE_RATE
        files.append((np.concatenate(parts), " ".join(words)))
        total += length
    return files


def run_barge(files, threads: int) -> tuple[float, list[str]]:
    from engine import Engine
    asr = Engine.from_pretrained(base_path(), mode="transcribe")
    start = time.perf_counter()
    results = asr.transcribe([audio for audio, _ in files])
    elapsed = time.perf_counter() - start
    assert all(result.error is None for result in results)
    return elapsed, [result.text for result in results]


def run_openai(files) -> tuple[float, list[str]]:
    import whisper
    model = openai_reference(base_path())
    start = time.perf_counter()
    texts = [whisper.transcribe(model, audio, fp16=False)["text"] for audio, _ in files]
    return time.perf_counter() - start, texts


def wer(files, texts) -> float:
    return word_error_rate(" ".join(ref for _, ref in files), " ".join(texts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0, help="total audio (default 30)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads for both (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    files = build_corpus(args.minutes * 60)
    audio_s = sum(len(audio) for audio, _ in files) / SAMPLE_RATE
    print(f"corpus: {len(files)} files, {audio_s / 60:.1f} min of espeak-ng speech; "
          f"torch threads {torch.get_num_threads()}", flush=True)
    barge_s, barge_texts = run_barge(files, torch.get_num_threads())
    print(f"barge          {barge_s:8.1f} s   RTF {barge_s / audio_s:.4f}   WER {wer(files, barge_texts):.3f}", flush=True)
    openai_s, openai_texts = run_openai(files)
    print(f"openai-whisper {openai_s:8.1f} s   RTF {openai_s / audio_s:.4f}   WER {wer(files, openai_texts):.3f}")
    print(f"speed ratio (openai-whisper time / barge time): {openai_s / barge_s:.2f}x")


if __name__ == "__main__":
    main()
