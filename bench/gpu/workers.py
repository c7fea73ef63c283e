"""Issue 30's GPU checks (GPU workers), one section of bench/gpu_check.py; each figure
printed beside its peer. `--cpu` runs the same checks on CPU engine processes (the OOM
through the BARGE_TEST_OOM_ABOVE_TOKENS hook instead of a real one).

  1. two engine processes on one GPU (`--devices 0,0`, BARGE_GPU_MEMORY_FRACTION=0.45)
     serve one generate job together; peer: one engine process at 0.9, same job.
  2. a real CUDA out-of-memory error (the allocator capped with
     torch.cuda.set_per_process_memory_fraction) is survived: every row embedded, the
     vectors equal an uncapped run's, the budget lowered.
  3. NVML figures in a worker's metrics; peer: nvidia-smi's figures at the same moment.

    python bench/gpu/workers.py            # on the GPU machine (bench/gpu_check.py runs it)
    python bench/gpu/workers.py --cpu      # here: the same checks on CPU
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(os.environ.get("BARGE_ROOT", Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="run the checks on CPU engine processes")
    parser.add_argument("--rows", type=int, default=None, help="prompts in the generate job")
    parser.add_argument("--embed-model", default=None,
                        help="embed model for the OOM check (name or folder); default: minilm here, on a GPU "
                             "random weights of its shape in gpu_inputs/minilm's config and tokenizer")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="barge-gpu-check-"))
    rows = args.rows or (128 if args.cpu else 600)
    print(f"# issue 30 checks on {'CPU' if args.cpu else 'GPU'}; work folder {work}")
    model = random_decoder(work / "decoder", small=args.cpu)
    check_shared_gpu(work, model, rows, args.cpu)
    check_oom(args.embed_model or ("minilm" if args.cpu else str(random_minilm(work / "minilm"))), args.cpu)
    check_telemetry(work, model, args.cpu)
    return 0


def random_decoder(folder: Path, small: bool) -> Path:
    """Random weights of a real Llama shape (no hub here): 16 layers of 1024 on a GPU."""
    from tests.support.random_decoders import save_random_decoder
    shape = {} if small else dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=16,
                                  num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=2048)
    return save_random_decoder(folder, "llama", **shape)


def random_minilm(folder: Path) -> Path:
    """all-MiniLM-L6-v2's shape with random weights (its config and tokenizer carried in gpu_inputs/minilm)."""
    import shutil

    import torch
    import transformers
    from safetensors.torch import save_file
    shutil.copytree(ROOT / "gpu_inputs" / "minilm", folder)
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig.from_pretrained(folder), add_pooling_layer=False)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors",
              metadata={"format": "pt"})
    return folder


def run_job(work: Path, name: str, model: Path, rows: int, devices: str, env: dict[str, str]) -> dict:
    """A generate job through a supervised worker; its wall time and the processes that committed."""
    from jobs import JobSpec
    from jobs.client import Client
    from jobs.settings import Settings
    data = work / name
    corpus = data / "corpus"
    corpus.mkdir(parents=True)
    prompts = [f"Barge {i} carries " + "coal and grain " * (i % 13) for i in range(rows)]
    pq.write_table(pa.table({"id": list(range(rows)), "text": prompts}), corpus / "in.parquet", row_group_size=64)
    env = {**os.environ, "BARGE_DATA_DIR": str(data), **env}
    log = open(data / "worker.log", "wb")
    worker = subprocess.Popen([sys.executable, "-m", "cli", "worker", "--model", str(model), "--devices", devices],
                              env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        num_ready = len(devices.split(",")) if "," in devices else int(devices.split(":")[1]) if ":" in devices else 1
        deadline = time.monotonic() + 300
        while (data / "worker.log").read_text(errors="replace").count(" ready.") < num_ready:
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((data / "worker.log").read_text(errors="replace")[-3000:])
            time.sleep(0.5)
        client = Client(settings=Settings.from_env(env))
        started = time.monotonic()
        job = client.submit(JobSpec(mode="generate", model=str(model), input=str(corpus), id_column="id",
                                    output=str(data / "out"), max_rows_per_shard=max(8, rows // 16),
                                    params={"max_tokens": 32, "temperature": 0.0, "ignore_eos": True}))
        state = job.wait(timeout=600)
        seconds = time.monotonic() - started
        workers = {s.worker_id for s in client.store.list_shards(job.id)}
        sizes = re.findall(r"GPU memory: ([^\"]+)", (data / "worker.log").read_text(errors="replace"))
        return {"status": str(state.status), "seconds": seconds, "rows": len(job.results()), "workers": len(workers),
                "sizes": sizes}
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=120)
        except subprocess.TimeoutExpired:
            worker.kill()


def check_shared_gpu(work: Path, model: Path, rows: int, cpu: bool) -> None:
    two = run_job(work, "two", model, rows, "cpu:2" if cpu else "0,0", {"BARGE_GPU_MEMORY_FRACTION": "0.45"})
    one = run_job(work, "one", model, rows, "cpu" if cpu else "0", {"BARGE_GPU_MEMORY_FRACTION": "0.9"})
    print(f"1. one job, {rows} prompts x 32 tokens: two engine processes (fraction 0.45 each): {two['status']}, "
          f"{two['rows']} rows, {two['workers']} processes committed, {rows / two['seconds']:.1f} rows/s | "
          f"peer, one process at 0.9: {one['status']}, {rows / one['seconds']:.1f} rows/s | ratio "
          f"{one['seconds'] / two['seconds']:.2f}x")
    for line in two["sizes"][:2] + one["sizes"][:1]:
        print(f"   sizes: {line[:240]}")


def check_oom(embed_model: str, cpu: bool) -> None:
    import numpy as np
    import torch

    from engine import Engine
    from jobs.models import resolve_model
    path = resolve_model(embed_model).path
    texts = [f"Sentence {i} about barges " + "and rivers " * (i % 40) for i in range(4000 if not cpu else 300)]
    device = "cpu" if cpu else "cuda"
    reference = Engine.from_pretrained(path, mode="embed", device=device, dtype="float32").encode(texts)
    if cpu:
        os.environ["BARGE_TEST_OOM_ABOVE_TOKENS"] = "300"
    engine = Engine.from_pretrained(path, mode="embed", device=device, dtype="float32",
                                    max_batch_tokens=None if cpu else 262144)
    if not cpu:   # a real OOM: the allocator may hand out only a sliver of the GPU beyond the weights
        torch.cuda.empty_cache()
        cap = (torch.cuda.memory_allocated() + 512 * 1024 ** 2) / torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(cap)
    started = time.perf_counter()
    outputs = engine.encode(texts)
    seconds = time.perf_counter() - started
    os.environ.pop("BARGE_TEST_OOM_ABOVE_TOKENS", None)
    if not cpu:
        torch.cuda.set_per_process_memory_fraction(1.0)
    errors = sum(o.error is not None for o in outputs)
    cosine = min(float(np.dot(o.embedding, r.embedding)) for o, r in zip(outputs, reference) if o.error is None)
    settings = engine.settings
    print(f"2. OOM ({'hook' if cpu else 'real, allocator capped'}): {len(texts)} rows, {errors} error rows, "
          f"{settings.get('num_oom_retries', 0)} OOMs survived, max_batch_tokens lowered to "
          f"{settings['max_batch_tokens']}, {seconds:.1f} s | peer, uncapped run: min cosine {cosine:.6f}")


def check_telemetry(work: Path, model: Path, cpu: bool) -> None:
    from tests.support.stack import free_port
    port = free_port()
    data = work / "telemetry"
    env = {**os.environ, "BARGE_DATA_DIR": str(data)}
    data.mkdir(parents=True)
    log = open(data / "worker.log", "wb")
    worker = subprocess.Popen([sys.executable, "-m", "cli", "worker", "--model", str(model), "--devices",
                               "cpu" if cpu else "0", "--metrics-port", str(port)], env=env, stdout=log,
                              stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 300
        text = ""
        while time.monotonic() < deadline and "barge_device_memory_total_bytes" not in text:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                time.sleep(1)
        figures = [line for line in text.splitlines() if line.startswith("barge_device_")]
        print("3. device figures in the metrics: " + ("; ".join(figures) or "NONE"))
        if not cpu:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used,memory.total,"
                                  "power.draw,temperature.gpu", "--format=csv,noheader"],
                                 capture_output=True, text=True).stdout.strip()
            print(f"   peer, nvidia-smi: {smi}")
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=120)
        except subprocess.TimeoutExpired:
            worker.kill()


if __name__ == "__main__":
    sys.exit(main())
