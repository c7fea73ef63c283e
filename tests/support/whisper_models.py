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
