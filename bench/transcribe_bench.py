"""Transcription speed: Barge's engine beside openai-whisper's `transcribe`, same process,
same weights (the real Whisper base), same CPU threads.

    .venv/bin/python bench/transcribe_bench.py                  # 30 minutes of speech
    .venv/bin/python bench/transcribe_bench.py --minutes 5 --threads 1
    .venv/bin/python bench/transcribe_bench.py --minutes 6 --long-form vad,sequential --voices

The corpus is espeak-ng speech of known sentences in files of mixed length (10 s to
3 min, sentences joined by 0.3–3 s pauses); with --voices each file has its own voice
(American, British, Scottish, a female variant) and speed (130–190 words a minute), and
its pauses are drawn from a short, a mixed or a long range. Both sides get the same 16 kHz arrays and
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


VOICES = ["en-us", "en-gb", "en-gb-scotland", "en-us+f3"]
SPEEDS_WPM = [130, 160, 190]
PAUSE_RANGES_S = [(0.2, 0.8), (0.3, 3.0), (1.5, 5.0)]


def build_corpus(total_s: float, seed: int = 0, voices: bool = False) -> list[tuple[np.ndarray, str]]:
    """(audio, reference text) files of 10 s .. 3 min until total_s seconds of audio."""
    rng = random.Random(seed)
    spoken: dict[tuple, np.ndarray] = {}
    files, total = [], 0.0
    while total < total_s:
        target_s = min(rng.choice([10, 20, 45, 90, 180]), max(10.0, total_s - total))
        voice, speed = (rng.choice(VOICES), rng.choice(SPEEDS_WPM)) if voices else ("en-us", 160)
        pauses = rng.choice(PAUSE_RANGES_S) if voices else (0.3, 3.0)
        parts, words, length = [silence(rng.uniform(0.2, 1.0))], [], 0.0
        while length < target_s:
            sentence = rng.choice(SENTENCES)
            if (sentence, voice, speed) not in spoken:
                spoken[(sentence, voice, speed)] = espeak(sentence, voice=voice, speed_wpm=speed)
            parts += [spoken[(sentence, voice, speed)], silence(rng.uniform(*pauses))]
            words.append(sentence)
            length = sum(len(p) for p in parts) / SAMPLE_RATE
        files.append((np.concatenate(parts), " ".join(words)))
        total += length
    return files


def run_barge(files, threads: int, long_form: str = "vad") -> tuple[float, list[str]]:
    from engine import Engine
    asr = Engine.from_pretrained(base_path(), mode="transcribe")
    start = time.perf_counter()
    results = asr.transcribe([audio for audio, _ in files], long_form=long_form)
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
    parser.add_argument("--long-form", default="vad", help="Barge's long_form modes to run, comma-separated "
                                                           "(vad, sequential; default vad)")
    parser.add_argument("--voices", action="store_true", help="several voices, speeds and pause lengths")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    files = build_corpus(args.minutes * 60, voices=args.voices)
    audio_s = sum(len(audio) for audio, _ in files) / SAMPLE_RATE
    print(f"corpus: {len(files)} files, {audio_s / 60:.1f} min of espeak-ng speech; "
          f"torch threads {torch.get_num_threads()}", flush=True)
    barge = {}
    for long_form in args.long_form.split(","):
        barge_s, barge_texts = barge[long_form] = run_barge(files, torch.get_num_threads(), long_form)
        print(f"barge {long_form:10} {barge_s:8.1f} s   RTF {barge_s / audio_s:.4f}   WER {wer(files, barge_texts):.3f}",
              flush=True)
    openai_s, openai_texts = run_openai(files)
    openai_wer = wer(files, openai_texts)
    print(f"openai-whisper   {openai_s:8.1f} s   RTF {openai_s / audio_s:.4f}   WER {openai_wer:.3f}")
    for long_form, (barge_s, barge_texts) in barge.items():
        print(f"{long_form}: speed ratio (openai-whisper time / barge time) {openai_s / barge_s:.2f}x, "
              f"WER minus openai-whisper's {wer(files, barge_texts) - openai_wer:+.3f}")


if __name__ == "__main__":
    main()
