"""Peak memory of streaming a Parquet input larger than memory should need, beside reading it whole.

    python bench/storage_memory.py [--gib 2.2] [--dir /tmp]

Writes two inputs under --dir (deleted afterwards), each at least --gib GiB:
  text-only   doc_id + text (~2 KiB of text a row)
  with-carry  doc_id + text (~256 B a row) + a big carried binary column (~2 KiB a row)
and for each, in a fresh subprocess per measurement, reads the text (and id) through
storage: inspect_input -> plan_shards -> read_shard over every shard, versus the peer:
pyarrow.parquet.read_table of the same columns. Prints peak RSS (/proc VmHWM)
beside the input size and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROWS_PER_GROUP = 16_384
GIB = 2**30


def random_strings(num_rows: int, num_chars: int) -> pa.Array:
    """Hex text that compresses no better than ~2x, built straight into Arrow buffers."""
    data = os.urandom(num_rows * num_chars // 2).hex().encode("ascii")
    offsets = np.arange(0, (num_rows + 1) * num_chars, num_chars, dtype=np.int32)
    return pa.StringArray.from_buffers(num_rows, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data))


def write_input(path: str, target_bytes: int, text_chars: int, carry_bytes: int) -> int:
    fields = [("doc_id", pa.int64()), ("text", pa.string())] + ([("carry", pa.binary())] if carry_bytes else [])
    start = 0
    with pq.ParquetWriter(path, pa.schema(fields)) as writer:
        while os.path.getsize(path) < target_bytes:
            columns = [pa.array(np.arange(start, start + ROWS_PER_GROUP), pa.int64()),
                       random_strings(ROWS_PER_GROUP, text_chars)]
            if carry_bytes:
                blob = os.urandom(ROWS_PER_GROUP * carry_bytes)
                offsets = np.arange(0, (ROWS_PER_GROUP + 1) * carry_bytes, carry_bytes, dtype=np.int32)
                columns.append(pa.BinaryArray.from_buffers(pa.binary(), ROWS_PER_GROUP,
                                                           [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(blob)]))
            writer.write_table(pa.Table.from_arrays(columns, schema=pa.schema(fields)))
            start += ROWS_PER_GROUP
    return os.path.getsize(path)


def measure_storage(path: str) -> dict:
    """Runs in the subprocess: stream every shard's text and id through storage."""
    from storage import inspect_input, plan_shards, read_shard

    baseline = peak_rss()
    info = inspect_input(path, columns={"input_column": "text", "id_column": "doc_id"})
    shards = plan_shards(info, max_rows_per_shard=8192, max_work_per_shard=4_000_000)
    num_rows = num_chars = 0
    for shard in shards:
        for batch in read_shard(shard, ["doc_id", "text"], batch_size=1024):
            num_rows += batch.num_rows
            num_chars += pc.sum(pc.binary_length(batch.column("text"))).as_py() or 0
    return {"num_rows": num_rows, "num_chars": num_chars, "num_shards": len(shards), "baseline": baseline}


def measure_peer(path: str) -> dict:
    """Runs in the subprocess: what reading the same columns whole costs."""
    baseline = peak_rss()
    table = pq.read_table(path, columns=["doc_id", "text"])
    return {"num_rows": table.num_rows, "baseline": baseline}


def peak_rss() -> int:
    """This process's peak resident set size, in bytes.

    VmHWM, not getrusage's ru_maxrss: ru_maxrss survives fork and exec, so a child of
    this (large) writer process would report the writer's peak as its own.
    """
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # not Linux: KiB, the best there is


def run_measurement(kind: str, path: str) -> dict:
    """One measurement in a fresh interpreter, so that peak RSS is that measurement's alone."""
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, __file__, "--measure", kind, path], capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"measuring {kind} failed:\n{completed.stderr[-3000:]}")
    return {**json.loads(completed.stdout.strip().splitlines()[-1]), "seconds": time.perf_counter() - started}


def report(name: str, path: str, size: int) -> None:
    metadata = pq.ParquetFile(path).metadata
    group = metadata.row_group(0)
    print(f"\n{name}: {size / GIB:.2f} GiB, {metadata.num_rows:,} rows, {metadata.num_row_groups} row groups "
          f"of {group.num_rows:,} rows ({group.total_byte_size / 2**20:.0f} MiB uncompressed each)")
    ours = run_measurement("storage", path)
    peer = run_measurement("peer", path)
    assert ours["num_rows"] == peer["num_rows"] == metadata.num_rows
    for label, result in (("barge read_shard (streaming)", ours), ("pyarrow read_table (peer)", peer)):
        print(f"  {label:30s} peak RSS {result['peak'] / 2**20:8.0f} MiB  "
              f"({result['peak'] / size:6.1%} of the input; {result['baseline'] / 2**20:.0f} MiB after imports)"
              f"  {result['seconds']:.1f} s")
    print(f"  shards: {ours['num_shards']}; peak RSS ratio barge/peer: {ours['peak'] / peer['peak']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.2)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--measure", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        kind, path = args.measure
        result = {"storage": measure_storage, "peer": measure_peer}[kind](path)
        print(json.dumps({**result, "peak": peak_rss()}))
        return
    workdir = tempfile.mkdtemp(prefix="barge-bench-", dir=args.dir)
    try:
        for name, text_chars, carry_bytes in (("text-only", 2048, 0), ("with-carry", 256, 2048)):
            path = os.path.join(workdir, f"{name}.parquet")
            size = write_input(path, int(args.gib * GIB), text_chars, carry_bytes)
            report(name, path, size)
            os.remove(path)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # storage, from a checkout
    main()
