"""What one refresh of the dashboard's jobs list costs, beside its peer in Barge: the
per-job path `barge jobs` ran until issue 41 (one progress() per job: three queries
each), against the dashboard's one aggregate over all listed jobs' shards (jobs.job_list,
which `barge jobs` now shares). Then the HTTP answers themselves through FastAPI's test
client. A long history is bench/listing_bench.py's.

    python bench/dashboard_bench.py --jobs 200 --shards 100 [--database-url postgresql://...]

Prints medians; the machine is whatever runs it (say which, and how loaded, beside
any figure you quote)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build(store, num_jobs: int, num_shards: int) -> str:
    """`num_jobs` running jobs of `num_shards` shards, half of them committed."""
    from jobs.spec import JobSpec
    spec = JobSpec(mode="embed", model="minilm", input="/in/a.parquet", output="/out/")
    for _ in range(num_jobs):
        job_id = store.create_job(spec, model_key="all-MiniLM-L6-v2", rows_total=10 * num_shards,
                                  output_schema="{}", webhook_secret=None)
        store.start_job(job_id, [dict(shard_index=i, file_index=0, url="/in/a.parquet", row_groups=[i],
                                      row_start=10 * i, num_rows=10) for i in range(num_shards)])
        for index in range(0, num_shards, 2):
            claim = store.claim_shard(job_id, index, worker_id="bench:1", lease_s=60)
            store.commit_shard(job_id, index, claim.token, rows_succeeded=10, rows_failed=0, num_tokens=100,
                               part=dict(name=f"part-{index}.parquet", num_rows=10, num_bytes=1, sha256="0" * 64))
    return job_id


def median_ms(task, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        task()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--shards", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    args = parser.parse_args()
    os.environ.setdefault("BARGE_DATA_DIR", tempfile.mkdtemp(prefix="barge-dashboard-bench-"))
    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.dashboard.reads import DashboardReads
    from jobs.client import Client
    client = Client(database_url=args.database_url) if args.database_url else Client()
    last = build(client.store, args.jobs, args.shards)
    store = client.store
    peer = median_ms(lambda: [store.progress(job.id) for job in store.list_jobs(args.jobs)], args.repeats)
    ours = median_ms(lambda: DashboardReads(store).jobs(None, limit=args.jobs), args.repeats)
    from jobs.api_keys import ApiKeys
    operator = ApiKeys(client.store.engine).create("bench", operator=True).secret
    http = TestClient(create_app(client), base_url="http://localhost", headers={"Authorization": f"Bearer {operator}"})
    listing = median_ms(lambda: http.get("/dashboard/api/jobs"), args.repeats)
    page = median_ms(lambda: http.get(f"/dashboard/jobs/{last}?fragment=1"), args.repeats)
    print(f"{args.jobs} jobs x {args.shards} shards on {client.store.engine.dialect.name}, median of {args.repeats}:")
    print(f"  one progress() per job (barge jobs until issue 41):  {peer:8.1f} ms")
    print(f"  one aggregate (DashboardReads.jobs, Client.jobs):    {ours:8.1f} ms   ({peer / ours:.1f}x faster)")
    print(f"  GET /dashboard/api/jobs (JSON, whole answer):        {listing:8.1f} ms")
    print(f"  GET /dashboard/jobs/ID?fragment=1 (a job's page):    {page:8.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
