"""A reference library's outputs, computed once per machine and kept on disk.

The model parity tests compare Barge's engine with an independent implementation on the same
weights (openai-whisper, transformers). Barge's side runs in every test run; the reference's
side is the same computation each time, on the same inputs, and it was a third of make
test's CPU. `computed_once` keeps what it returns, keyed by everything that could change it:

- the name of the computation and the inputs it is given (arrays and tensors by their bytes);
- the weights (each file's name, size and modification time);
- the installed versions of the libraries it runs and of torch and numpy;
- the source of the modules that say what it computes (the test module, by default);
- this machine's CPU (model name and flags: fp32 sums may round differently elsewhere).

Anything else differing, the reference runs again. BARGE_TEST_REFERENCE_CACHE=0 runs every
reference every time (and keeps nothing). The files are pickles (torch.save) under the test
cache, `cache_folder()`: trusted local data, removable at will. The SmolLM2 conversion
(tests.support.smollm2) and Triton's sm_90 cache (tests.support.sm90) live there too.

    expected = computed_once("whisper-greedy", lambda: whisper.decode(...), inputs=clips,
                             weights=base_path(), libraries=("openai-whisper",))
"""

from __future__ import annotations

import hashlib
import os
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, TypeVar

import numpy as np
import torch

T = TypeVar("T")
ENABLED_VARIABLE = "BARGE_TEST_REFERENCE_CACHE"


def computed_once(name: str, compute: Callable[[], T], *, inputs: Any, weights: str | Path | list,
                  libraries: tuple[str, ...], sources: tuple[str | Path, ...] = ()) -> T:
    """compute(), or what it returned before for the same key (see the module's doc).
    `sources`: the files whose text defines the computation; the caller's module by default."""
    if os.environ.get(ENABLED_VARIABLE, "1") == "0":
        return compute()
    files = [Path(source) for source in sources] or [Path(sys._getframe(1).f_code.co_filename)]
    digest = hashlib.sha256()
    for part in (name, _inputs_digest(inputs), _weights_identity(weights), _versions(libraries),
                 *(path.read_bytes() for path in files), _cpu_identity()):
        digest.update(part if isinstance(part, bytes) else str(part).encode())
        digest.update(b"\0")
    return kept(cache_folder() / "references" / f"{name}-{digest.hexdigest()[:24]}.pt", compute)


def cache_folder() -> Path:
    """What the tests keep between runs on this machine (remove it to compute all again)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "barge-tests"


def kept(path: Path, compute: Callable[[], T]) -> T:
    """What torch.save wrote at `path`, else compute() written there (whole, or not at all:
    another process may be writing the same file). Pickles: trusted local data only."""
    if path.exists():
        try:
            return torch.load(path, weights_only=False)
        except Exception as error:      # a file cut short, or written by another build: compute again
            print(f"{path}: {error!r}; computing it again", file=sys.stderr)
    result = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    torch.save(result, partial)
    os.replace(partial, path)
    return result


def _inputs_digest(value: Any) -> str:
    digest = hashlib.sha256()
    _feed(digest, value)
    return digest.hexdigest()


def _feed(digest, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().contiguous()
        digest.update(f"tensor{value.dtype}{tuple(value.shape)}".encode())
        digest.update(value.view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    elif isinstance(value, np.ndarray):
        digest.update(f"array{value.dtype}{value.shape}".encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, dict):
        digest.update(b"dict")
        for key, item in value.items():     # in order: the order is part of the inputs
            _feed(digest, key)
            _feed(digest, item)
    elif isinstance(value, (list, tuple)):
        digest.update(type(value).__name__.encode())
        for item in value:
            _feed(digest, item)
    elif isinstance(value, (str, bytes, int, float, bool, type(None))):
        digest.update(f"{type(value).__name__}:{value!r}".encode())
    else:
        raise TypeError(f"computed_once: cannot key an input of type {type(value).__name__}")
    digest.update(b"\0")


def _weights_identity(weights: str | Path | list) -> str:
    paths = [Path(path) for path in (weights if isinstance(weights, list) else [weights])]
    files = []
    for path in paths:
        for file in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if file.is_file():
                stat = file.stat()
                files.append(f"{file}:{stat.st_size}:{stat.st_mtime_ns}")
    if not files:
        raise FileNotFoundError(f"computed_once: no weights at {paths}")
    return "\n".join(files)


def _versions(libraries: tuple[str, ...]) -> str:
    return " ".join(f"{name}=={metadata.version(name)}" for name in ("torch", "numpy", *libraries))


def _cpu_identity() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown cpu"
    wanted = [line for line in lines if line.startswith(("model name", "flags"))]
    return "\n".join(dict.fromkeys(wanted))
