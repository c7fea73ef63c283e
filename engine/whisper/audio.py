"""Audio in: bytes, a path or fsspec URL, or a float32 array -> 16 kHz mono `Audio`.

Decoding is PyAV's (the FFmpeg libraries it bundles: wav, flac, mp3, ogg/opus, m4a, ...),
resampled by FFmpeg's swresample, as openai-whisper's `ffmpeg -ar 16000 -ac 1` does.

Memory: decoded audio is kept in one-second blocks and a block of digital silence is
kept as nothing, so a two-hour file of silence costs a list of Nones rather than 460 MB.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.whisper.config import SAMPLE_RATE

BLOCK_SAMPLES = SAMPLE_RATE      # one second


class AudioError(ValueError):
    """This row's audio cannot be used; the message says why (it becomes the row's error)."""


@dataclass
class Audio:
    blocks: list[np.ndarray | None]   # BLOCK_SAMPLES float32 each (the last may be shorter); None: all zeros
    num_samples: int

    @property
    def duration_s(self) -> float:
        return self.num_samples / SAMPLE_RATE

    def samples(self, start: int, end: int) -> np.ndarray:
        """float32 samples [start, end), zeros where a block was silent."""
        start, end = max(0, start), min(end, self.num_samples)
        out = np.zeros(max(0, end - start), dtype=np.float32)
        for index in range(start // BLOCK_SAMPLES, -(-end // BLOCK_SAMPLES)):
            block = self.blocks[index]
            if block is None:
                continue
            block_start = index * BLOCK_SAMPLES
            lo, hi = max(start, block_start), min(end, block_start + len(block))
            out[lo - start:hi - start] = block[lo - block_start:hi - block_start]
        return out

    @classmethod
    def from_array(cls, samples: np.ndarray) -> "Audio":
        builder = _BlockBuilder()
        builder.add(samples)
        return builder.finish()


class _BlockBuilder:
    def __init__(self):
        self.blocks: list[np.ndarray | None] = []
        self.pending: list[np.ndarray] = []
        self.num_pending = 0
        self.num_samples = 0

    def add(self, samples: np.ndarray) -> None:
        self.pending.append(samples)
        self.num_pending += len(samples)
        self.num_samples += len(samples)
        if self.num_pending >= BLOCK_SAMPLES:
            joined = np.concatenate(self.pending)
            whole = len(joined) // BLOCK_SAMPLES * BLOCK_SAMPLES
            for start in range(0, whole, BLOCK_SAMPLES):
                self._keep(joined[start:start + BLOCK_SAMPLES])
            self.pending, self.num_pending = [joined[whole:]], len(joined) - whole

    def _keep(self, block: np.ndarray) -> None:
        self.blocks.append(np.array(block, dtype=np.float32) if np.any(block) else None)

    def finish(self) -> Audio:
        if self.num_pending:
            self._keep(np.concatenate(self.pending))
        return Audio(self.blocks, self.num_samples)


def load_audio(source) -> Audio:
    """Decode one row's audio; AudioError (a ValueError) saying why it cannot be used."""
    if source is None:
        raise AudioError("audio is null")
    if isinstance(source, np.ndarray):
        audio = _from_array(source)
    elif isinstance(source, (bytes, bytearray, memoryview)):
        if len(source) == 0:
            raise AudioError("audio is empty (0 bytes)")
        audio = _decode(io.BytesIO(bytes(source)), "audio bytes")
    elif isinstance(source, (str, Path)):
        audio = _decode_url(str(source))
    else:
        raise AudioError(f"audio must be bytes, a path or URL, or a float32 array, not {type(source).__name__}")
    if audio.num_samples == 0:
        raise AudioError("audio is empty (no samples decoded)")
    return audio


def _from_array(samples: np.ndarray) -> Audio:
    if samples.ndim != 1:
        raise AudioError(f"an audio array must be 1-D 16 kHz mono samples, got shape {samples.shape}")
    if not np.issubdtype(samples.dtype, np.floating):
        raise AudioError(f"an audio array must hold floats in [-1, 1], got dtype {samples.dtype}")
    return Audio.from_array(samples.astype(np.float32, copy=False))


def _decode_url(url: str) -> Audio:
    if "://" not in url:
        path = Path(url).expanduser()
        if not path.is_file():
            raise AudioError(f"audio file not found: {url}")
        if path.stat().st_size == 0:
            raise AudioError(f"audio file is empty (0 bytes): {url}")
        with open(path, "rb") as f:
            return _decode(f, url)
    import fsspec
    try:
        with fsspec.open(url, "rb") as f:
            return _decode(f, url)
    except (FileNotFoundError, PermissionError, OSError) as exc:
        raise AudioError(f"cannot read audio {url}: {exc}") from None


def _decode(fileobj, name: str) -> Audio:
    import av
    builder = _BlockBuilder()
    try:
        with av.open(fileobj, mode="r", metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise AudioError(f"{name} has no audio stream")
            resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
            for frame in _frames(container):
                for out in resampler.resample(frame):
                    builder.add(out.to_ndarray()[0])
            for out in resampler.resample(None):
                builder.add(out.to_ndarray()[0])
    except av.FFmpegError as exc:
        raise AudioError(f"{name} is not decodable audio: {exc}") from None
    return builder.finish()


def _frames(container):
    """Decoded frames of the first audio stream. A corrupt packet (a truncated MP3's last
    frame, say) is skipped, as faster-whisper does: what decodes is transcribed."""
    import av
    stream = container.streams.audio[0]
    for packet in container.demux(stream):
        try:
            yield from packet.decode()
        except av.InvalidDataError:
            continue
