"""The real Whisper weights (MODELS.md) for tests, and openai-whisper built on the same tensors."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

from jobs.models import resolve_model


def base_path() -> str:
    return resolve_model("whisper-base").path      # joined into the cache folder on first use


def tiny_en_path() -> str:
    return resolve_model("whisper-tiny.en").path


def openai_reference(path: str):
    """openai-whisper's own Whisper module holding this checkpoint's tensors (fp32): the
    CTranslate2 tensors converted to openai names by engine.whisper.loader."""
    import whisper
    from engine.whisper.loader import load_checkpoint
    checkpoint = load_checkpoint(path)
    fields = whisper.model.ModelDimensions.__dataclass_fields__
    dims = whisper.model.ModelDimensions(**{name: getattr(checkpoint.config, name) for name in fields})
    model = whisper.model.Whisper(dims)
    model.load_state_dict({name: tensor.to(torch.float32) for name, tensor in checkpoint.state_dict.items()})
    return model.eval()


def encode_each_window_once(reference) -> None:
    """openai-whisper's transcribe(word_timestamps=True) runs the encoder twice on each
    window: to decode it, and again in find_alignment, which calls the whole model on the
    same mel (there with SDPA off; the outputs agree to float rounding). The encoder is
    most of a short clip's reference time (Whisper base: 2.2 of 5.5 s of CPU a clip), so
    the second call on the same mel gets the first call's output."""
    encode = reference.encoder.forward
    last: dict = {}

    def once(mel: torch.Tensor) -> torch.Tensor:
        if "mel" in last and last["mel"].shape == mel.shape and torch.equal(last["mel"], mel):
            return last["features"]
        features = encode(mel)
        last.update(mel=mel.clone(), features=features)
        return features

    reference.encoder.forward = once


def model_folder(path: str) -> Path:
    return Path(path)


@contextmanager
def one_thread():
    """Decoding is hundreds of small ops per step; on a busy 2-core machine (CI, or
    engineers sharing one) each multi-threaded op waits a scheduler slice for its second
    thread, so these tests run torch on one thread, and put the setting back after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
