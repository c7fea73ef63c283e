"""The CPU kernels' build survives a builder killed mid-build.

Found by the chaos soak (bench/chaos_soak.py): a worker SIGKILLed while torch's
extension builder held its lock file left the file behind, and every worker started
after it hung for ever at its first engine call, renewing its shard's lease. And its
compilers ran on as orphans, writing into the folder the next builder uses (issue 41).
"""

import os
import shutil
import signal
import subprocess
import sys
import time
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


def _processes_building_in(folder: Path) -> list[str]:
    """Command lines of the live processes whose arguments or working folder name `folder`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if str(folder) in cmdline or cwd.startswith(str(folder)):
            found.append(f"{entry.name}: {cmdline[:200]}")
    return found


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_a_builder_killed_mid_compile_leaves_no_compiler_running(tmp_path):
    # Given a process building the kernels from scratch in a fresh extensions folder
    extensions = tmp_path / "torch_extensions"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions)}
    builder = subprocess.Popen([sys.executable, "-c", LOAD], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not any("cc1plus" in line or "g++" in line for line in _processes_building_in(extensions)):
        assert time.monotonic() < deadline and builder.poll() is None, "no compiler started"
        time.sleep(0.05)
    # When it is killed as the OOM killer kills, mid-compile
    builder.kill()
    builder.wait()
    # Then its compilers end with it (a second for ninja to pass the signal on)
    deadline = time.monotonic() + 10
    while (left := _processes_building_in(extensions)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, left
