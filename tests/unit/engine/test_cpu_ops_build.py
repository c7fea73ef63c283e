"""The CPU kernels' build survives a builder killed mid-build.

Found by the chaos soak (bench/chaos_soak.py): a worker SIGKILLed while torch's
extension builder held its lock file left the file behind, and every worker started
after it hung for ever at its first engine call, renewing its shard's lease.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.kernels import cpu_ops

REPO = Path(__file__).resolve().parents[3]
LOAD = "from engine.kernels import cpu_ops; print(cpu_ops.cpu_kernels_available())"


@pytest.mark.skipif(not cpu_ops.cpu_kernels_available(), reason="the CPU kernels cannot be built here")
def test_the_lock_file_of_a_builder_killed_mid_build_does_not_hang_the_next_process(tmp_path):
    # Given this machine's build, copied into a fresh extensions folder (so no rebuild is
    # needed), with the lock file torch's builder leaves when it is killed holding it
    built = cpu_ops.build_folder()
    extensions = tmp_path / "torch_extensions"
    shutil.copytree(built, extensions / built.name)
    (extensions / built.name / "lock").touch()

    # When a fresh process loads the kernels from there
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions)}
    try:
        loaded = subprocess.run([sys.executable, "-c", LOAD], cwd=REPO, env=env, capture_output=True, text=True,
                                timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the process waited on the dead builder's lock file")

    # Then it loads them, and the dead builder's lock is gone
    assert loaded.stdout.strip() == "True", loaded.stderr[-2000:]
    assert not (extensions / built.name / "lock").exists()
