"""The machine a bench's figures come from, printed beside them by every bench.

/proc/cpuinfo's model name alone does not tell these machines apart ("AMD EPYC" names both
a Zen 4 and other generations, whose fp32 rates here differ by half), so the family and
model numbers and the vector units that decide a CPU run's speed follow it."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    """E.g. 'AMD EPYC (family 25, model 17; AVX-512, bf16, no AMX), 2 logical CPUs'."""
    try:
        fields = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if not key.strip() and fields:
                break                           # the first processor's block is enough
            fields.setdefault(key.strip(), value.strip())
        flags = set(fields.get("flags", "").split())
        units = ["AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"]
        units += ["bf16"] if "avx512_bf16" in flags else []
        units += ["AMX" if "amx_tile" in flags else "no AMX"]
        name = (f"{fields.get('model name', 'unknown CPU')} (family {fields.get('cpu family', '?')}, "
                f"model {fields.get('model', '?')}; {', '.join(units)})")
    except OSError:
        name = platform.processor() or "unknown CPU"
    return f"{name}, {os.cpu_count()} logical CPUs"


if __name__ == "__main__":
    print(cpu_model())
