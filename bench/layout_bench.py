"""Input layouts: the same rows as (a) one file of 2,000-row groups, (b) one file of one row
group, (c) 2,000 small files, each run as a whole embedding job over a real S3 API server.

    .venv/bin/python bench/layout_bench.py                    # 10,000 rows, MiniLM, 2,000 files in (c)
    .venv/bin/python bench/layout_bench.py --num-rows 2000 --num-files 400

A moto server stands for S3, behind a proxy that counts the body bytes of every GET
answer per object: bytes read are counted at the storage, footers, readahead and
staged copies included. One worker process on the embedded default serves all three
jobs, warmed up by a small job first, so the model's load is in none of them. A job's
time is from the client's submit call (which checks every footer) to the final state
in the job's record; the ratio is against (a), run in the same process. The layouts
run interleaved, --repeats rounds of (a), (b), (c); each line gives a layout's median
round, its fastest and its slowest; "vs (a)" is the median of each round's ratio to (a).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from bench.embed_bench import build_corpus  # noqa: E402
from bench.machine import cpu_model  # noqa: E402


@dataclass
class Run:
    layout: str
    num_files: int
    num_row_groups: int
    input_bytes: int
    job_s: float = 0.0
    submit_s: float = 0.0  # the client's checks (every footer), before the job is recorded
    plan_s: float = 0.0  # recorded -> running: the plan task (footers, ids, staging)
    bytes_read: int = 0  # served for the input's objects
    staged_bytes_read: int = 0  # served for the job's staged copies
    num_shards: int = 0


def write_layouts(fs, bucket: str, table: pa.Table, num_files: int) -> list[Run]:
    """(a), (b), (c) of `table` under s3://bucket/a|b|c/."""
    def put(key: str, part: pa.Table, row_group_size: int) -> None:
        sink = io.BytesIO()
        pq.write_table(part, sink, row_group_size=row_group_size)
        fs.pipe_file(f"{bucket}/{key}", sink.getvalue())
    put("a/corpus.parquet", table, 2000)
    put("b/corpus.parquet", table, table.num_rows)
    rows_per_file = -(-table.num_rows // num_files)
    for index, start in enumerate(range(0, table.num_rows, rows_per_file)):
        put(f"c/part-{index:05d}.parquet", table.slice(start, rows_per_file), rows_per_file)
    runs = []
    for layout, name in (("a", "(a) 2,000-row groups"), ("b", "(b) one row group"),
                         ("c", f"(c) {num_files:,} small files")):
        listed = fs.ls(f"{bucket}/{layout}", detail=True)
        groups = sum(pq.ParquetFile(io.BytesIO(fs.cat_file(e["name"]))).metadata.num_row_groups for e in listed)
        runs.append(Run(name, len(listed), groups, sum(e["size"] for e in listed)))
    return runs


def run_job(client, proxy, bucket: str, layout: str, run: Run, tmp: Path, model: str) -> None:
    from jobs import JobSpec, JobStatus
    proxy.clear()
    started = time.time()
    job = client.submit(JobSpec(mode="embed", model=model, input=f"s3://{bucket}/{layout}/", id_column="doc_id",
                                output=f"s3://{bucket}/out-{layout}-{int(started * 1000)}/"))
    submitted = time.time()
    state = job.wait(timeout=3600, poll_s=2.0)
    if state.status != JobStatus.SUCCEEDED:
        raise SystemExit(f"{run.layout}: job {state.status}: {state.error}")
    run.job_s = (submitted - started) + (state.finished_at - state.created_at)
    run.submit_s, run.plan_s = submitted - started, state.started_at - state.created_at
    run.bytes_read = proxy.bytes_served(f"/{bucket}/{layout}/")
    run.staged_bytes_read = proxy.bytes_served(f"/{bucket}/out-{layout}")  # the staged copies' GETs
    run.num_shards = sum(state.shards.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-rows", type=int, default=10_000)
    parser.add_argument("--num-files", type=int, default=2_000)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import s3fs
    from tests.integration.s3server import S3Server
    from tests.support.faulty_proxy import FaultyProxy
    from tests.support.stack import stack

    texts = build_corpus(args.num_rows)
    table = pa.table({"doc_id": pa.array(range(args.num_rows), pa.int64()), "text": texts})
    with S3Server() as s3, FaultyProxy(s3.endpoint_url) as proxy, tempfile.TemporaryDirectory() as tmp:
        s3.create_bucket("bench")
        fs = s3fs.S3FileSystem(**s3.storage_options)
        runs = write_layouts(fs, "bench", table, args.num_files)
        env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_ENDPOINT_URL": proxy.endpoint_url, "AWS_DEFAULT_REGION": "us-east-1"}
        os.environ.update(env)
        with stack("embedded", Path(tmp) / "barge", env) as deployment:
            deployment.start_worker(args.model)
            client = deployment.client()
            warm = Run("warm-up", 0, 0, 0)
            fs.pipe_file("bench/warm/w.parquet", _parquet(table.slice(0, 64)))
            run_job(client, proxy, "bench", "warm", warm, Path(tmp), args.model)
            rounds = []
            for _ in range(args.repeats):
                rounds.append([dataclasses.replace(run) for run in runs])
                for run, layout in zip(rounds[-1], "abc"):
                    run_job(client, proxy, "bench", layout, run, Path(tmp), args.model)
                    print(f"  {run.layout}: {run.job_s:.1f} s (load {os.getloadavg()[0]:.1f})", file=sys.stderr)
    report(rounds, args)


def _parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def report(rounds: list[list[Run]], args) -> None:
    """One line a layout: its median round (the machine is shared, so single rounds swing), and
    beside it the fastest and slowest; each round's ratio is against (a) of the same round."""
    runs = [sorted(repeats, key=lambda run: run.job_s)[len(repeats) // 2] for repeats in zip(*rounds)]
    spread = [(min(r.job_s for r in repeats), max(r.job_s for r in repeats)) for repeats in zip(*rounds)]
    ratios = [statistics.median(round_[i].job_s / round_[0].job_s for round_ in rounds) for i in range(len(runs))]
    print(f"\n{args.num_rows:,} rows, model {args.model}, S3 API (moto) on 127.0.0.1, median of {len(rounds)} "
          f"rounds (vs (a): median of the per-round ratios); CPU: {cpu_model()}")
    print(f"{'layout':26} {'files':>6} {'groups':>6} {'shards':>6} {'job s':>7} {'vs (a)':>7} {'submit s':>8} "
          f"{'plan s':>7} {'input MB':>9} {'read MB':>8} {'read/input':>10} {'staged MB read':>14} {'fastest-slowest s':>17}")
    for run, ratio, (fastest_s, slowest_s) in zip(runs, ratios, spread):
        print(f"{run.layout:26} {run.num_files:>6} {run.num_row_groups:>6} {run.num_shards:>6} {run.job_s:>7.1f} "
              f"{ratio:>6.2f}x {run.submit_s:>8.1f} {run.plan_s:>7.1f} {run.input_bytes / 1e6:>9.2f} "
              f"{run.bytes_read / 1e6:>8.2f} {run.bytes_read / run.input_bytes:>9.2f}x "
              f"{run.staged_bytes_read / 1e6:>14.2f} {fastest_s:>8.1f}-{slowest_s:<8.1f}")


if __name__ == "__main__":
    main()
