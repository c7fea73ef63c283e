"""Compiled CPU kernels, built once per machine by torch's extension builder (g++ and ninja).

Two attention kernels plain PyTorch does badly on a CPU:

- cpu/paged_decode.cpp: decode attention over the paged KV cache. Batched matmuls need
  each sequence's K/V gathered out of its blocks first, which reads and writes the whole
  context again on every step; the kernel reads each K/V row once where it lies.
- cpu/varlen_attention.cpp: attention over a packed batch of texts (the embedders). SDPA
  needs one call per run of equal-length texts, and for texts of tens of tokens its
  fused kernel spends more on setup than on math; the kernel takes the whole batch.

Where they cannot be built (no compiler, BARGE_CPU_KERNELS=0), attention keeps its
PyTorch paths, which give the same results.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

log = logging.getLogger("barge.engine")

SOURCES = tuple(Path(__file__).with_name("cpu") / name for name in ("paged_decode.cpp", "varlen_attention.cpp"))
# -ffast-math for the compile only, so that expf vectorises (glibc's libmvec); the link
# step never sees it, so no crtfastmath changes the process's denormal handling.
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math"]
_lock = threading.Lock()
_built: bool | None = None


def cpu_kernels_available() -> bool:
    """Build (or load the build of) the CPU kernels on first call; False if they cannot be."""
    global _built
    with _lock:
        if _built is None:
            _built = _build()
        return _built


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """q [num_seqs, num_heads, head_dim] fp32, caches [num_kv_heads, num_blocks, block_size, head_dim],
    block_tables long [num_seqs, max_blocks], context_lens long [num_seqs] -> like q."""
    return torch.ops.barge_cpu.paged_decode(q, k_cache, v_cache, block_tables, context_lens, scale)


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, scale: float,
                     causal: bool = False, half_window: int | None = None) -> torch.Tensor:
    """Attention over a packed batch, each text attending only to itself: q [num_tokens, num_heads,
    head_dim] fp32, k/v [num_tokens, num_kv_heads, head_dim] (any row stride; heads and head_dim
    contiguous within a row), cu_seqlens [num_seqs + 1] -> [num_tokens, num_heads, head_dim].
    causal: a token sees those before it; half_window: at most this many positions away."""
    return torch.ops.barge_cpu.varlen_attention(q, k, v, cu_seqlens, scale, causal,
                                                -1 if half_window is None else half_window)


def _cpu_features() -> bytes:
    """What -march=native compiles for: the CPU's model and instruction-set flags."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            lines = f.read().split(b"\n\n")[0].splitlines()
    except OSError:
        return platform.processor().encode()
    return b"\n".join(line for line in lines if line.split(b":")[0].strip() in (b"model name", b"flags"))


def _build_name() -> str:
    """One build per source, torch installation and CPU: checkouts with their own virtual
    environments share ~/.cache/torch_extensions without rebuilding over each other, and
    a build for -march=native on one CPU (AVX-512, say) is never loaded on another
    (AVX2 only), where it would die of an illegal instruction."""
    digest = hashlib.sha256(b"".join(source.read_bytes() for source in SOURCES)
                            + torch.__version__.encode() + torch.__file__.encode() + _cpu_features())
    return f"barge_cpu_ops_{digest.hexdigest()[:12]}"


def _build() -> bool:
    if os.environ.get("BARGE_CPU_KERNELS", "1") == "0":
        return False
    if shutil.which("ninja") is None:   # the ninja wheel installs next to this interpreter
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    try:
        build_directory = build_folder()
        with _one_builder_at_a_time(build_directory):
            if not (build_directory / f"{_build_name()}.so").exists():   # the name hashes the sources
                _compile_in_child(build_directory)   # its compilers die with this process (engine.kernels.cpu_build)
            compile_into(build_directory)        # up to date now: ninja finds nothing to do, and it loads
    except Exception as error:      # noqa: BLE001 - any build failure leaves the PyTorch path
        log.warning("CPU kernels could not be built (%s); attention takes its PyTorch paths",
                    str(error).splitlines()[0] if str(error) else type(error).__name__)
        return False
    return True


def compile_into(build_directory: Path) -> None:
    """torch's builder: compile what is out of date in `build_directory`, and load the library."""
    from torch.utils import cpp_extension
    cpp_extension.load(name=_build_name(), sources=[str(source) for source in SOURCES],
                       build_directory=str(build_directory), is_python_module=False,
                       extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"])


def _compile_in_child(build_directory: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "engine.kernels.cpu_build", str(os.getpid()), str(build_directory)],
                          start_new_session=True, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in (done.stderr or "").splitlines() if line.strip()]
        raise RuntimeError(f"the build exited with status {done.returncode}: {lines[-1] if lines else 'no output'}")


def build_folder() -> Path:
    """Where the build lives: TORCH_EXTENSIONS_DIR (else torch's default root) / the build's name."""
    from torch.utils import cpp_extension
    folder = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()) / _build_name()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextmanager
def _one_builder_at_a_time(build_directory: Path) -> Iterator[None]:
    """NOTE: torch's builder keeps other processes out with a lock *file* (FileBaton,
    `lock` in the build folder) that it deletes when done. A process killed while it holds
    it — a worker SIGKILLed or OOM-killed as it starts — leaves the file behind, and every
    later process waits on it for ever: each worker of the machine hangs at its first
    engine call, holding its shard's lease. An flock is released by the kernel when its
    holder dies, so builders take one first; a baton file found under it is a dead
    builder's, and is removed."""
    with open(build_directory.with_name(build_directory.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            (build_directory / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
