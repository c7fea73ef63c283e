"""Speech with known words, made on the spot with espeak-ng (Debian's `espeak-ng`), and
the real voices in /usr/share/sounds/alsa (Debian's `alsa-utils`)."""

from __future__ import annotations

import re
import shutil
import subprocess
import wave
from pathlib import Path

import numpy as np

from engine.quant.compare import edit_rate

ALSA_DIR = Path("/usr/share/sounds/alsa")
SAMPLE_RATE = 16_000

# Plain sentences without numbers or names, so a normalised word error rate is fair.
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A barge moves slowly down the wide river at night.",
    "We carried the heavy boxes into the old wooden house.",
    "The children played in the garden until the sun went down.",
    "Please close the window before you leave the room.",
    "The train was late because of the snow on the tracks.",
    "She bought fresh bread and milk at the small shop.",
    "The doctor told him to drink more water every day.",
    "Our teacher read a long story about a brave little mouse.",
    "The wind blew the leaves across the empty street.",
    "He forgot his keys on the kitchen table this morning.",
    "The boat was tied to the dock with a thick rope.",
    "They walked along the beach and looked for shells.",
    "The library is open from early morning until late evening.",
    "My brother likes to paint pictures of mountains and lakes.",
    "The farmer fed the cows and the horses before breakfast.",
    "A cold rain fell on the city all through the night.",
    "The cat slept in a warm spot next to the fire.",
    "We need to finish this work before the end of the week.",
    "The music was so loud that nobody could hear a word.",
    "The old man sat on a bench and fed the birds.",
    "Her new car is parked in front of the white building.",
    "The river was full of fish after the spring rain.",
    "Many people came to the market to buy fruit and vegetables.",
    "The plane landed safely after a long flight across the ocean.",
    "You should always wash your hands before you eat.",
    "The students opened their books and started to read.",
    "A small dog barked at the man who delivered the mail.",
    "The bridge was closed while the workers repaired the road.",
    "We watched the stars from the top of the green hill.",
    "The coffee was too hot to drink right away.",
    "The store will close early on the day before the holiday.",
    "He wrote a letter to his mother every single week.",
    "The ship carried grain and coal to the northern harbor.",
    "The garden was full of red flowers and tall green grass.",
    "She sang a quiet song while she cooked dinner for the family.",
]


def has_espeak() -> bool:
    return shutil.which("espeak-ng") is not None


def espeak(text: str, voice: str = "en-us", speed_wpm: int = 160) -> np.ndarray:
    """16 kHz float32 speech of `text` (espeak-ng writes 22.05 kHz WAV; resampled by PyAV)."""
    from engine.whisper.audio import load_audio
    wav = subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed_wpm), "--stdout", text],
                         check=True, capture_output=True).stdout
    audio = load_audio(wav)
    return audio.samples(0, audio.num_samples)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SAMPLE_RATE), dtype=np.float32)


def long_form(sentences: list[str], gaps_s: list[float]) -> np.ndarray:
    """Sentences joined by silences: speech, gap, speech, gap, ... (gaps cycle)."""
    parts = [silence(0.5)]
    for i, sentence in enumerate(sentences):
        parts += [espeak(sentence), silence(gaps_s[i % len(gaps_s)])]
    return np.concatenate(parts)


def write_wav(path: Path, samples: np.ndarray, rate: int = SAMPLE_RATE) -> Path:
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm.tobytes())
    return path


def normalise(text: str) -> list[str]:
    return re.sub(r"[^a-z' ]+", " ", text.lower().replace("-", " ")).split()


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word-level Levenshtein distance over the reference's word count, after normalise()."""
    return edit_rate(normalise(reference), normalise(hypothesis))
