"""What a page of the jobs list costs with a long history, beside the per-job path that
`barge jobs` ran until issue 41 (one `Store.progress()` per listed job: three queries each).

Builds `--jobs` jobs (default 100,000) of 1 to 8 shards each with bulk inserts: the newest
few queued or running, the rest finished (mostly succeeded), a tenth owned by an API key's
batch and a twentieth run by a schedule, as the dashboard's joins meet them. Then, medians
of `--repeats` runs:

    barge jobs's first page and a deep page (Client.job_page, --limit 20)
    GET /dashboard/api/jobs, first and deep page (200 jobs, the real app, an operator key)

each beside one progress() per job of the same page, and the ratio. The per-job path is
timed without finding its page (list_jobs for the first page, nothing for the deep one),
and on the new schema, so it gains from migration 0016's index too.

    python bench/listing_bench.py [--jobs 100000] [--database-url postgresql://postgres@127.0.0.1:5432/barge_listing]

A PostgreSQL database named in --database-url is created for the run and dropped after
(refused if it exists). Say which machine and how loaded beside any figure you quote."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.dashboard_bench import median_ms  # noqa: E402 - one timing rule for both listing benches

CHUNK_JOBS = 5_000      # jobs (and their shards) per bulk insert
ROWS_PER_SHARD = 2_048
ENGINE = json.dumps({"model": "all-MiniLM-L6-v2", "mode": "embed", "device": "cuda", "dtype": "float16",
                     "max_num_batched_tokens": 16384, "max_num_seqs": 256})


def build(store, num_jobs: int, seed: int = 41) -> None:
    """`num_jobs` jobs, oldest first, one a minute up to now."""
    from jobs import tables
    from jobs.api_tables import api_batches
    from jobs.api_keys import ApiKeys
    from jobs.status import JobStatus
    rng, now = random.Random(seed), time.time()
    key_id = ApiKeys(store.engine).create("bench-owner").key.id
    schedule_id = uuid.uuid4().hex
    with store.engine.begin() as conn:
        conn.execute(tables.schedules.insert().values(
            id=schedule_id, name="nightly", cron="0 2 * * *", timezone="UTC", template="{}", is_enabled=True,
            catchup="skip", next_run_at=now, created_at=now, updated_at=now))
    for start in range(0, num_jobs, CHUNK_JOBS):
        jobs, shards, batches, runs = [], [], [], []
        for index in range(start, min(start + CHUNK_JOBS, num_jobs)):
            job = _job(rng, index, num_jobs, now)
            job_shards = _shards(rng, job, now)
            if JobStatus(job["status"]).is_finished:   # a few seconds after its last shard
                job["finished_at"] = max(shard["finished_at"] for shard in job_shards) + rng.uniform(1, 10)
                job["updated_at"] = job["finished_at"]
            jobs.append(job)
            shards += job_shards
            if index % 10 == 0:
                batches.append(dict(id=f"batch_{job['id']}", key_id=key_id, job_id=job["id"],
                                    endpoint="/v1/embeddings", model="minilm", input_file_id=f"file-{job['id'][:24]}",
                                    completion_window="24h", metadata="{}", num_requests=job["rows_total"],
                                    created_at=job["created_at"]))
            elif index % 20 == 1:
                runs.append(dict(schedule_id=schedule_id, period_at=job["created_at"], kind="scheduled",
                                 job_id=job["id"], status="submitted", claimed_until=0.0, created_at=job["created_at"]))
        with store.engine.begin() as conn:
            conn.execute(tables.jobs.insert(), jobs)
            conn.execute(tables.shards.insert(), shards)
            conn.execute(api_batches.insert(), batches)
            conn.execute(tables.schedule_runs.insert(), runs)


def _job(rng: random.Random, index: int, num_jobs: int, now: float) -> dict:
    from jobs.status import JobStatus
    age = num_jobs - index   # the newest is 1 minute old
    created = now - 60.0 * age
    status = (JobStatus.QUEUED if age <= 5 else JobStatus.RUNNING if age <= 40 else
              rng.choices([JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.EXPIRED],
                          [90, 5, 3, 2])[0])
    num_shards = rng.randint(1, 8)   # a queued job knows its rows, and has no shard yet
    started = None if status == JobStatus.QUEUED else created + rng.uniform(1, 30)
    spec = {"mode": "embed", "model": "minilm", "input": f"s3://corpus/{index // 1000}/docs-{index}.parquet",
            "output": f"s3://results/{index // 1000}/job-{index}/", "input_column": "text", "id_column": "doc_id",
            "params": {}, "metadata": {"team": "search", "run": index}, "max_rows_per_shard": ROWS_PER_SHARD}
    return dict(id=uuid.UUID(int=rng.getrandbits(128)).hex, status=int(status), mode="embed",
                model_key="all-MiniLM-L6-v2", spec=json.dumps(spec), rows_total=num_shards * ROWS_PER_SHARD,
                output_schema='{"id": "string", "embedding": "list<float>"}' * 4,
                error="shard 0 failed: CUDA out of memory" if status == JobStatus.FAILED else None,
                created_at=created, started_at=started, finished_at=None, updated_at=now, task_sent_at=created)


def _shards(rng: random.Random, job: dict, now: float) -> list[dict]:
    from jobs.status import JobStatus, ShardStatus
    status, rows = JobStatus(job["status"]), []
    for index in range(0 if status == JobStatus.QUEUED else job["rows_total"] // ROWS_PER_SHARD):
        shard = ShardStatus.COMMITTED
        if status == JobStatus.RUNNING:
            shard = rng.choice([ShardStatus.COMMITTED, ShardStatus.RUNNING, ShardStatus.PENDING])
        elif status != JobStatus.SUCCEEDED and index == 0:
            shard = ShardStatus.FAILED if status == JobStatus.FAILED else ShardStatus.CANCELLED
        started = None if shard == ShardStatus.PENDING else job["started_at"] + rng.uniform(0, 60)
        finished = min(started + rng.uniform(20, 120), now) if shard.is_finished else None
        committed = shard == ShardStatus.COMMITTED
        plan = {"shard_index": index, "file_index": 0, "url": json.loads(job["spec"])["input"],
                "row_groups": [index], "row_start": index * ROWS_PER_SHARD, "num_rows": ROWS_PER_SHARD}
        part = {"name": f"part-00000-{index:05d}.parquet", "num_rows": ROWS_PER_SHARD, "num_bytes": 3_200_000,
                "sha256": f"{rng.getrandbits(256):064x}"}
        rows.append(dict(job_id=job["id"], shard_index=index, plan=json.dumps(plan), num_rows=ROWS_PER_SHARD,
                         status=int(shard), attempt=0 if started is None else 1, token=uuid.uuid4().hex,
                         part=json.dumps(part) if committed else None,
                         rows_succeeded=ROWS_PER_SHARD - 3 if committed else 0, rows_failed=3 if committed else 0,
                         error="CUDA out of memory" if shard == ShardStatus.FAILED else None, started_at=started,
                         finished_at=finished, updated_at=finished or now, worker_id="gpu-3:4242",
                         lease_expires_at=now + 60 if shard == ShardStatus.RUNNING else None,
                         num_tokens=300_000 if committed else 0, device="cuda" if committed else None,
                         engine=ENGINE if committed else None))
    return rows


def analyze(store) -> None:
    """PostgreSQL's autovacuum analyzes a table within a minute or so of a bulk load; until
    then the planner has no statistics and reads an IN list of 20 job ids by a sequential
    scan of every shard (130 ms for `barge jobs`' first page, not 3). The bench does it at once."""
    from sqlalchemy import text
    with store.engine.begin() as conn:
        conn.execute(text("ANALYZE"))


def per_job_progress(store, job_ids: list[str]) -> list:
    """The path `barge jobs` ran until issue 41: one progress() per listed job."""
    return [store.progress(job_id) for job_id in job_ids]




@contextlib.contextmanager
def throwaway_database(url: str | None):
    """A PostgreSQL database named in `url`, created now and dropped after; SQLite: a file in
    a temporary folder, removed after."""
    if url is None:
        with tempfile.TemporaryDirectory(prefix="barge-listing-bench-") as folder:
            yield f"sqlite:///{folder}/barge.db"
        return
    import sqlalchemy as sa
    url = sa.engine.make_url(url.replace("postgresql://", "postgresql+psycopg://", 1))
    admin = sa.create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{url.database}"'))   # fails if it exists: never drop a real one
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE "{url.database}" WITH (FORCE)'))
        admin.dispose()


def cli_lines(argv: list[str]) -> str:
    """What `barge jobs ...` prints, indented."""
    from cli.main import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(argv)
    return "\n".join("    " + line for line in out.getvalue().splitlines())


def compare(label: str, ours_ms: float, peer_ms: float) -> None:
    print(f"  {label:44} {ours_ms:8.1f} ms   per-job progress() {peer_ms:8.1f} ms   ({peer_ms / ours_ms:5.1f}x)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    args = parser.parse_args()
    from jobs.secret_box import generate_key
    os.environ.setdefault("BARGE_SECRET_KEY", generate_key())
    with tempfile.TemporaryDirectory(prefix="barge-listing-bench-") as data_dir, \
            throwaway_database(args.database_url) as url:
        os.environ.setdefault("BARGE_DATA_DIR", data_dir)
        os.environ["BARGE_DATABASE_URL"] = url
        run(args)
    return 0


def run(args) -> None:
    from fastapi.testclient import TestClient

    from api.app import create_app
    from jobs.api_keys import ApiKeys
    from jobs.client import Client
    client = Client()
    started = time.perf_counter()
    build(client.store, args.jobs)
    if client.store.engine.dialect.name == "postgresql":
        analyze(client.store)
    print(f"{args.jobs} jobs, {count_shards(client.store)} shards on {client.store.engine.dialect.name}, "
          f"built in {time.perf_counter() - started:.0f} s; medians of {args.repeats}:")
    store, deep = client.store, args.jobs * 9 // 10
    cursor = nth_newest(store, deep)   # the deep page starts 90% of the way back
    first, later = client.job_page(20), client.job_page(20, before=cursor)
    compare("barge jobs, first page (20)", median_ms(lambda: client.job_page(20), args.repeats),
            median_ms(lambda: per_job_progress(store, [job.id for job in store.list_jobs(20)]), args.repeats))
    compare(f"barge jobs, page after job {deep:,} (20)",
            median_ms(lambda: client.job_page(20, before=cursor), args.repeats),
            median_ms(lambda: per_job_progress(store, [job.job_id for job in later.jobs]), args.repeats))
    operator = ApiKeys(store.engine).create("bench", operator=True).secret
    http = TestClient(create_app(client), base_url="http://localhost", headers={"Authorization": f"Bearer {operator}"})
    dashboard = http.get("/dashboard/api/jobs").json()
    deep_dashboard = http.get("/dashboard/api/jobs", params={"before": cursor}).json()
    for label, params, listed in (("GET /dashboard/api/jobs, first page (200)", {}, dashboard),
                                  (f"GET /dashboard/api/jobs?before= job {deep:,}", {"before": cursor},
                                   deep_dashboard)):
        compare(label, median_ms(lambda: http.get("/dashboard/api/jobs", params=params), args.repeats),
                median_ms(lambda: per_job_progress(store, [job["id"] for job in listed["jobs"]]), args.repeats))
    assert [job.job_id for job in first.jobs] == [job["id"] for job in dashboard["jobs"][:20]]
    print(f"  the deep dashboard page's shard aggregate: {shards_read(store, deep_dashboard['jobs'])}")
    print("  barge jobs:\n" + cli_lines(["jobs"]))
    print(f"  barge jobs --before {cursor}:\n" + cli_lines(["jobs", "--before", cursor]))


def shards_read(store, listed: list[dict]) -> str:
    """How the page's one aggregate reaches barge_shards: PostgreSQL's rows read, SQLite's plan."""
    from sqlalchemy import text

    from jobs.job_list import shard_sums_query
    query = shard_sums_query([job["id"] for job in listed], time.time(), 300.0)
    sql = str(query.compile(store.engine, compile_kwargs={"literal_binds": True}))
    with store.engine.connect() as conn:
        if store.engine.dialect.name == "sqlite":
            plan = [row[-1] for row in conn.execute(text("EXPLAIN QUERY PLAN " + sql))]
            return "; ".join(line for line in plan if "barge_shards" in line)
        [[plan]] = conn.execute(text("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)).all()
    nodes, read = [plan[0]["Plan"]], 0
    while nodes:
        node = nodes.pop()
        nodes += node.get("Plans", [])
        if node.get("Relation Name") == "barge_shards":
            read += node["Actual Rows"] * node["Actual Loops"]
    return f"{read} shard rows read (EXPLAIN ANALYZE), of {count_shards(store):,}"


def nth_newest(store, n: int) -> str:
    from sqlalchemy import select

    from jobs import tables
    job = tables.jobs.c
    query = select(job.id).order_by(job.created_at.desc(), job.id.desc()).offset(n - 1).limit(1)
    with store.engine.connect() as conn:   # OFFSET here only finds the bench's cursor
        return conn.execute(query).scalar_one()


def count_shards(store) -> int:
    from sqlalchemy import func, select

    from jobs import tables
    with store.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(tables.shards)).scalar_one()


if __name__ == "__main__":
    raise SystemExit(main())
