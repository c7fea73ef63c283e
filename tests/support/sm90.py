"""Compile Triton kernels for an H100 (sm_90) on a machine without a GPU: a script run in
a fresh process without TRITON_INTERPRET, so a kernel the interpreter accepts but the
compiler refuses fails on CPU, not first on a GPU. The script prints "compiled" at its end.

The compiled kernels are kept in Triton's own cache, once per machine, under the test cache
(tests.support.reference_cache.cache_folder()): Triton keys each entry by the kernel's source, its
constexprs, the target and Triton's version (ptxas ships with it), so an edited kernel is
compiled again and a kernel the compiler refuses is never cached. With a cache in tmp_path,
the three tests compiled their 45 kernels on every run: 37 s of CPU, 7 s with the cache warm
(2-core Intel Xeon with AMX, 2026-12-07)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def assert_compiles_without_interpreter(script: str) -> None:
    from tests.support.reference_cache import cache_folder
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(cache_folder() / "triton-sm90"), TRITON_DEFAULT_FP_FUSION="1")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                            timeout=300, cwd=ROOT)
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-4000:]
