"""Keep freed memory in the process on Linux CPUs, as vLLM's and IPEX's CPU builds do by
preloading tcmalloc or jemalloc.

glibc serves every allocation above its mmap threshold with a fresh mapping and hands it
back to the kernel when freed, so each engine step, whose temporaries (gathered KV
blocks, activations) are tens of MB, page-faults all of them in again: measured here,
gathering 46 MB of KV blocks took 32 ms into fresh memory and 6 ms into reused memory,
and decoding a 100M Llama at batch 128 ran 21 % faster. Raising the mmap and trim
thresholds makes freed blocks stay in the heap for the next step. The cost is that the
process keeps its peak memory instead of returning it, which a worker that holds an
engine for its lifetime does anyway.
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger("barge.engine")

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3     # glibc's mallopt parameters
_applied = False


def keep_freed_memory() -> bool:
    """Once per process, on glibc; True if the allocator now keeps freed memory."""
    global _applied
    if _applied or not sys.platform.startswith("linux"):
        return _applied
    try:
        libc = ctypes.CDLL("libc.so.6")
        _applied = bool(libc.mallopt(M_MMAP_THRESHOLD, 1 << 30) and libc.mallopt(M_TRIM_THRESHOLD, (1 << 31) - 1))
    except (OSError, AttributeError):     # not glibc (musl, say): nothing to tune
        return False
    if not _applied:
        log.info("mallopt refused the thresholds; freed memory goes back to the kernel")
    return _applied
