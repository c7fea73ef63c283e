"""Log-Mel features, batched in torch, as Whisper was trained on them.

The filterbank is librosa's `filters.mel(sr=16000, n_fft=400, n_mels=N)` (Slaney mel
scale and area normalisation), computed here instead of shipped: a test checks it
against the `mel_filters.npz` in the openai-whisper sdist.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from engine.whisper.config import HOP_LENGTH, SAMPLE_RATE

N_FFT = 400
_F_SP = 200.0 / 3           # Slaney: linear below 1 kHz, 3 mels per 200 Hz
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOG_STEP = math.log(6.4) / 27.0


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    hz = np.asarray(hz, dtype=np.float64)
    log_part = _MIN_LOG_MEL + np.log(np.maximum(hz, _MIN_LOG_HZ) / _MIN_LOG_HZ) / _LOG_STEP
    return np.where(hz >= _MIN_LOG_HZ, log_part, hz / _F_SP)


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    log_part = _MIN_LOG_HZ * np.exp(_LOG_STEP * (mels - _MIN_LOG_MEL))
    return np.where(mels >= _MIN_LOG_MEL, log_part, _F_SP * mels)


@functools.lru_cache(maxsize=4)
def mel_filters(n_mels: int) -> np.ndarray:
    """[n_mels, N_FFT // 2 + 1] float32 triangular filters."""
    fft_freqs = np.linspace(0, SAMPLE_RATE / 2, N_FFT // 2 + 1)
    mel_freqs = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(SAMPLE_RATE / 2), n_mels + 2))
    widths = np.diff(mel_freqs)
    ramps = mel_freqs[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_freqs[2:] - mel_freqs[:-2]))[:, None]
    return weights.astype(np.float32)


def log_mel(audio: torch.Tensor, n_mels: int) -> torch.Tensor:
    """[batch, samples] float32 16 kHz -> [batch, n_mels, samples // 160] log-Mel.

    Each row is normalised on its own (max - 8 dB floor), as openai-whisper does for one
    file: batching must not change a chunk's features."""
    window = torch.hann_window(N_FFT, device=audio.device)
    stft = torch.stft(audio, N_FFT, HOP_LENGTH, window=window, return_complex=True)
    power = stft[..., :-1].abs() ** 2
    filters = torch.from_numpy(mel_filters(n_mels)).to(audio.device)
    log_spec = torch.clamp(filters @ power, min=1e-10).log10()
    floor = log_spec.amax(dim=(1, 2), keepdim=True) - 8.0
    return (torch.maximum(log_spec, floor) + 4.0) / 4.0
