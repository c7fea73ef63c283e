"""Audio files in the formats users send, encoded on the spot with PyAV (FFmpeg)."""

from __future__ import annotations

import io
import wave
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16_000
# format -> (container, codec, codec sample rate)
FORMATS = {"mp3": ("mp3", "libmp3lame", 16_000), "flac": ("flac", "flac", 16_000),
           "ogg": ("ogg", "libopus", 48_000), "m4a": ("ipod", "aac", 16_000)}


def encode(samples: np.ndarray, kind: str) -> bytes:
    """16 kHz float32 mono -> the bytes of a `kind` file (see FORMATS)."""
    import av
    container, codec, rate = FORMATS[kind]
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout="mono")
        frame = av.AudioFrame.from_ndarray((np.clip(samples, -1, 1) * 32767).astype(np.int16)[None, :],
                                           format="s16", layout="mono")
        frame.sample_rate = SAMPLE_RATE
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buffer.getvalue()


def write_silence_wav(path: Path, seconds: int, rate: int = SAMPLE_RATE) -> Path:
    """A long 16-bit WAV of digital silence, written a minute at a time."""
    minute = bytes(2 * rate * 60)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        for _ in range(seconds // 60):
            out.writeframes(minute)
        out.writeframes(bytes(2 * rate * (seconds % 60)))
    return path
