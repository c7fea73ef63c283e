"""Every GPU check a session with a GPU runs, in one command that ends within 8 minutes on
one H200: each section is a script of its own, run capped, its whole output kept in
$OUT/<section>.log and printed here; every figure is printed beside its peer from the same
run. The GPU machine has no network: `bash bench/gpu_prepare.sh` here fills gpu_inputs/
(ignored by git) with what the sections read there, and the device call carries it:

    bash bench/gpu_prepare.sh                                  # here, once
    run(command="python3 bench/gpu_check.py", carry=["gpu_inputs"], timeout_s=540)
    python bench/gpu_check.py --cpu                            # here: each section's tiny CPU run
    python bench/gpu_check.py --only generate,fp8              # some sections

Sections (issue; cap in seconds on a GPU):
  env       the GPU, driver and versions
  kernels   the engine tests with CUDA cases (sync-free decode step, graphs, Whisper's graphed
            step, fused ops), then the Triton kernel tests on CUDA tensors (on CPU they run
            under the interpreter in the test suite, so --cpu skips them)             (21, 22, 23)
  generate  bench/gpu/generate.py: 1B workload vs transformers, batch-1 share of the HBM
            roofline (1B, 8B), batch 64 on 8B, fp32 greedy parity, host time per step  (21)
  layers    bench/gpu/layers.py: fused ops and the sampler against their unfused peers  (21)
  fp8       bench/fp8_bench.py: FP8 and fp8-block against bf16 on the 8B shape          (22)
  embed     bench/gpu/embed.py: MiniLM and BERT-base shapes against sentence-transformers (23)
  whisper   bench/gpu/whisper.py: base shape against transformers' Whisper, fp16 vs fp32,
            CUDA fp32 text against CPU fp32                                             (23)
  workers   bench/gpu/workers.py: two engine processes on one GPU, a real OOM survived,
            NVML figures in the metrics                                                 (30)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INPUTS = ROOT / "gpu_inputs"

# First the engine tests whose CUDA cases only a GPU runs (the decode step under CUDA's sync
# debug mode, graphed and eager; Whisper's graphed decoder step; the fused decoder ops), so
# the cap cuts the tail of the kernel tests rather than them; then every kernel test.
ENGINE_TESTS = ["tests/unit/engine/generate/test_paged_attention_engine.py", "tests/unit/engine/generate/test_cuda_graph.py",
                "tests/unit/engine/whisper/test_whisper_decoder_step.py", "tests/unit/engine/test_fused_ops.py",
                "tests/unit/engine/generate/test_fp8_kv_cache.py"]
KERNEL_TESTS = ["tests/unit/engine/test_varlen_attention_kernel.py", "tests/unit/engine/test_engine_packed_attention.py",
                "tests/unit/engine/quant/test_fp8_kernels.py"]
# (name, command on a GPU, command with --cpu or None to skip there, cap in seconds on a GPU)
SECTIONS = [
    ("env", ["bash", "-c", "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; "
             f"{sys.executable} -c 'import sys,torch,triton,transformers; print(sys.version.split()[0], "
             "torch.__version__, triton.__version__, transformers.__version__)'"], None, 10),
    ("kernels", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=short", "-W", "ignore",
                 "KERNEL_TESTS"], None, 55),
    ("generate", [sys.executable, "bench/gpu/generate.py"], [sys.executable, "bench/gpu/generate.py", "--cpu"], 125),
    ("layers", [sys.executable, "bench/gpu/layers.py"], [sys.executable, "bench/gpu/layers.py", "--cpu"], 20),
    ("fp8", [sys.executable, "bench/fp8_bench.py"], [sys.executable, "bench/fp8_bench.py"], 60),
    ("embed", [sys.executable, "bench/gpu/embed.py"], [sys.executable, "bench/gpu/embed.py", "--cpu"], 55),
    ("whisper", [sys.executable, "bench/gpu/whisper.py"], [sys.executable, "bench/gpu/whisper.py", "--cpu"], 85),
    ("workers", [sys.executable, "bench/gpu/workers.py"], [sys.executable, "bench/gpu/workers.py", "--cpu"], 70),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="each section's tiny CPU run (no caps)")
    parser.add_argument("--only", default="", help="comma-separated sections to run")
    args = parser.parse_args()
    out = Path(os.environ.get("OUT") or "/tmp/barge-gpu-check")
    out.mkdir(parents=True, exist_ok=True)
    env = prepare_environment(cpu=args.cpu)
    chosen = set(filter(None, args.only.split(",")))
    started, results = time.monotonic(), []
    for name, gpu_argv, cpu_argv, cap in SECTIONS:
        argv = cpu_argv if args.cpu else gpu_argv
        if (chosen and name not in chosen) or argv is None:
            continue
        argv = [arg for part in argv for arg in (kernel_tests() if part == "KERNEL_TESTS" else [part])]
        results.append(run_section(name, argv, None if args.cpu else cap, env, out))
    print(f"\n=== summary ({time.monotonic() - started:.0f} s in all; logs in {out})")
    for name, rc, seconds in results:
        print(f"  {name:9s} rc={rc} {seconds:.0f} s")
    return 0 if all(rc == 0 for _, rc, _ in results) else 1


def kernel_tests() -> list[str]:
    """The engine tests with CUDA cases, then the kernel test files there are: the three of the
    first GPU run and any newer one named *kernel*."""
    found = {str(path.relative_to(ROOT)) for path in (ROOT / "tests" / "unit").rglob("test_*kernel*.py")}
    return ENGINE_TESTS + sorted((set(KERNEL_TESTS) | found) - set(ENGINE_TESTS))


def prepare_environment(cpu: bool) -> dict[str, str]:
    """What the sections need on a bare GPU machine: the wheels a worker imports beyond its
    image (installed into a folder on PYTHONPATH), the GPL-3 text the random decoders'
    tokenizer is trained on, and offline settings for transformers."""
    env = {**os.environ, "BARGE_ROOT": str(ROOT), "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if not cpu:
        env["BARGE_CPU_KERNELS"] = "0"      # no C++ build of the CPU decode kernel on the GPU machine
    wheels = INPUTS / "wheels"
    if wheels.is_dir() and subprocess.run([sys.executable, "-c", "import celery, sqlalchemy, alembic, croniter"],
                                          capture_output=True).returncode != 0:
        site = Path("/tmp/barge-site")
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                               "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, wheels.glob("*.whl"))],
                              capture_output=True, text=True)
        print(f"# wheels from {wheels} into {site}: rc={done.returncode} {done.stderr.strip()[-500:]}")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH", "")]))
    licence = Path("/usr/share/common-licenses/GPL-3")
    if not licence.exists() and (INPUTS / "GPL-3").exists():
        try:
            licence.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(INPUTS / "GPL-3", licence)
        except OSError as error:
            print(f"# could not place the GPL-3 text the random decoders' tokenizer reads: {error}")
    return env


def run_section(name: str, argv: list[str], cap: float | None, env: dict[str, str], out: Path) -> tuple[str, int, float]:
    print(f"\n=== {name}" + (f" (cap {cap:.0f} s)" if cap else ""), flush=True)
    started = time.monotonic()
    log_path = out / f"{name}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            rc = process.wait(timeout=cap)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()
            rc = 124
    seconds = time.monotonic() - started
    lines = log_path.read_text(errors="replace").splitlines()
    shown = [line for line in lines if line.strip() and "Warning" not in line and "warn(" not in line]
    print("\n".join(shown[-40:]))
    print(f"=== {name} rc={rc}{' (cap reached)' if rc == 124 else ''} {seconds:.0f} s", flush=True)
    return name, rc, seconds


if __name__ == "__main__":
    sys.exit(main())
