"""`python -m engine.kernels.cpu_build PARENT_PID BUILD_DIR`: the CPU kernels' compile, in a
process of its own whose compilers die with the process that asked for it.

torch's extension builder runs ninja, and ninja runs each g++ in a process group of its
own. Built in the worker itself, a worker killed mid-build (SIGKILL, the OOM killer, its
supervisor) left ninja and the compilers running on as orphans, writing into the build
folder the next builder uses. Here the parent's death reaches this process as SIGTERM
(PR_SET_PDEATHSIG), which it hands to ninja (in this process's group: the parent starts it
in a new session), and ninja ends its compilers' groups before it exits.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1


def die_with(parent_pid: int) -> None:
    """SIGTERM this process when the thread that started it exits; at once if it already has."""
    signal.signal(signal.SIGTERM, _end_the_build)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:   # it died before the prctl took
        _end_the_build(signal.SIGTERM, None)


def _end_the_build(_signum, _frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        os.killpg(os.getpgrp(), signal.SIGTERM)   # ninja: it interrupts its compilers' groups and exits
    except ProcessLookupError:
        pass
    time.sleep(0.5)
    os._exit(128 + signal.SIGTERM)


def main(argv: list[str]) -> int:
    die_with(int(argv[1]))
    from engine.kernels.cpu_ops import compile_into
    compile_into(Path(argv[2]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
