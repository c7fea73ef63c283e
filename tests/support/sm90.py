"""Compile Triton kernels for an H100 (sm_90) on a machine without a GPU: a script run in
a fresh process without TRITON_INTERPRET, so a kernel the interpreter accepts but the
compiler refuses fails on CPU, not first on a GPU. The script prints "compiled" at its end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def assert_compiles_without_interpreter(script: str, cache_dir: Path) -> None:
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(cache_dir), TRITON_DEFAULT_FP_FUSION="1")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                            timeout=300, cwd=ROOT)
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-4000:]
