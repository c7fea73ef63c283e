"""GPU workers as operators run them, on CPU (issue 30): `barge worker --devices cpu:2`
runs two supervised engine processes that share a job; a SIGKILLed engine process is
restarted and its shard finishes once; an out-of-memory error in a step (the real
torch.OutOfMemoryError, raised by the BARGE_TEST_OOM_ABOVE_TOKENS hook) costs no row and
lowers the engine's budget, visible in the report, the manifest and the metrics.
Real worker processes started as a user starts them, on the embedded default."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from jobs import JobSpec, JobStatus, ShardStatus
from tests.support.stack import free_port, stack, wait_until

FAST_RECOVERY = {"BARGE_LEASE_S": "3", "BARGE_HOUSEKEEPING_S": "0.5", "BARGE_REQUEUE_AFTER_S": "10",
                 "BARGE_CHUNK_ROWS": "32"}


def write_corpus(folder: Path, num_rows: int, long_rows: tuple[int, ...] = ()) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    texts = [("barge " * 300 if i in long_rows else f"Row {i} about barges " + "and rivers " * (i % 9))
             for i in range(num_rows)]
    pq.write_table(pa.table({"doc_id": pa.array(range(num_rows), pa.int64()), "text": texts}),
                   folder / "corpus.parquet", row_group_size=50)


def start_supervisor(deployment, devices: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`barge worker --model minilm --devices DEVICES`, waited for until every engine process is ready."""
    deployment.data_dir.mkdir(parents=True, exist_ok=True)
    log_path = deployment.data_dir / "supervisor.log"
    process = subprocess.Popen([sys.executable, "-m", "cli", "worker", "--model", "minilm", "--devices", devices],
                               env={**os.environ, **deployment.env, **(env or {})}, stdout=open(log_path, "wb"),
                               stderr=subprocess.STDOUT)
    process.log_path = log_path
    deployment.workers.append(process)   # stop_workers sends it SIGTERM: it drains its engine processes
    num_ready = 2 if devices == "cpu:2" else 1
    wait_until(lambda: log_path.read_text().count(" ready.") >= num_ready or process.poll() is not None,
               180, "the engine processes")
    assert process.poll() is None, log_path.read_text()[-4000:]
    return process


def engine_pids(log_text: str) -> dict[str, list[int]]:
    """slot -> the pids of its engine processes, in start order, from the supervisor's log."""
    pids: dict[str, list[int]] = {}
    for slot, pid in re.findall(r"engine process (\S+) started \(pid (\d+)", log_text):
        pids.setdefault(slot, []).append(int(pid))
    return pids


def assert_every_row_once(job, num_rows: int, output: Path) -> dict:
    ids = job.results().column("doc_id").to_pylist()
    assert sorted(ids) == list(range(num_rows))
    manifest = json.loads((output / "_manifest.json").read_text())
    assert sum(part["num_rows"] for part in manifest["parts"]) == num_rows
    return manifest


def test_two_cpu_engine_processes_share_a_job_and_a_killed_one_comes_back(tmp_path):
    with stack("embedded", tmp_path / "barge", FAST_RECOVERY) as deployment:
        # Given a supervised worker with two CPU engine processes.
        write_corpus(tmp_path / "corpus", 3000)
        supervisor = start_supervisor(deployment, "cpu:2")
        pids = engine_pids(supervisor.log_path.read_text())
        assert sorted(pids) == ["cpu:0", "cpu:1"]
        client = deployment.client()
        # When a job of 60 shards runs, both engine processes commit shards of it, and then
        # one of them is SIGKILLed while it holds a shard.
        job = client.submit(JobSpec(mode="embed", model="minilm", input=str(tmp_path / "corpus"), id_column="doc_id",
                                    output=str(tmp_path / "out"), max_rows_per_shard=50))
        wait_until(lambda: len({s.worker_id for s in client.store.list_shards(job.id)
                                if s.status == ShardStatus.COMMITTED}) == 2, 180, "both processes to commit a shard")
        held = wait_until(lambda: next((s for s in client.store.list_shards(job.id)
                                        if s.status == ShardStatus.RUNNING), None), 120, "a running shard")
        holder = held.worker_id
        victim = int(holder.rsplit(":", 1)[1])
        victim_slot = next(slot for slot, slot_pids in pids.items() if victim in slot_pids)
        os.kill(victim, signal.SIGKILL)
        # Then the supervisor starts that slot's engine process again ...
        wait_until(lambda: len(engine_pids(supervisor.log_path.read_text())[victim_slot]) == 2, 60, "the restart")
        state = job.wait(timeout=300)
        log_text = supervisor.log_path.read_text()
        assert state.status == JobStatus.SUCCEEDED, log_text[-4000:]
        assert f"engine process {victim_slot} exited with status -9; restarting it" in log_text
        # ... every row is in the result exactly once, and both devices committed shards.
        manifest = assert_every_row_once(job, 3000, tmp_path / "out")
        devices = {engine["device_id"] for engine in manifest["stats"]["engines"]}
        assert devices == {"cpu:0", "cpu:1"}, manifest["stats"]["engines"]
        redone = next(s for s in client.store.list_shards(job.id) if s.shard_index == held.shard_index)
        assert redone.status == ShardStatus.COMMITTED and redone.worker_id != holder
        assert supervisor.poll() is None
        # `barge workers` lists each engine process's slot with its device's figures (the CPU's here).
        listing = subprocess.run([sys.executable, "-m", "cli", "workers"], env={**os.environ, **deployment.env},
                                 capture_output=True, text=True, timeout=60)
        slots = {line.split()[1] for line in listing.stdout.splitlines()[1:] if "GiB" in line}
        assert slots == {"cpu:0", "cpu:1"}, listing.stdout + listing.stderr


def test_an_oom_in_a_step_costs_no_row_and_lowers_the_budget(tmp_path):
    port = free_port()
    with stack("embedded", tmp_path / "barge", {"BARGE_CHUNK_ROWS": "64"}) as deployment:
        # Given a worker whose engine "runs out of memory" in any step over 200 tokens,
        # and a corpus with two rows of about 300 tokens (cut to minilm's 256: too many alone).
        write_corpus(tmp_path / "corpus", 300, long_rows=(17, 230))
        deployment.start_worker(env={"BARGE_TEST_OOM_ABOVE_TOKENS": "200"}, metrics_port=port)
        client = deployment.client()
        # When a job runs through it.
        job = client.submit(JobSpec(mode="embed", model="minilm", input=str(tmp_path / "corpus"), id_column="doc_id",
                                    output=str(tmp_path / "out"), max_rows_per_shard=100))
        state = job.wait(timeout=300)
        # Then the job succeeds with every row exactly once, the two long rows as error rows.
        assert state.status == JobStatus.SUCCEEDED, deployment.worker_logs()
        manifest = assert_every_row_once(job, 300, tmp_path / "out")
        table = job.results()
        errors = {row["doc_id"]: row["error"] for row in table.to_pylist() if row["error"] is not None}
        assert sorted(errors) == [17, 230] and all("out of memory" in e for e in errors.values())
        # ... and the engine's lowered budget is in the report's engines, the manifest and the metrics.
        lowered = [e for e in manifest["stats"]["engines"] if e.get("num_oom_retries")]
        assert lowered and all(e["max_batch_tokens"] <= 200 for e in lowered), manifest["stats"]["engines"]
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        retries = re.search(r'barge_engine_oom_retries_total\{mode="embed",model="[^"]+"\} (\S+)', metrics)
        assert retries and float(retries.group(1)) >= 3, metrics[-2000:]
        budget = re.search(r'barge_batch_max_tokens\{mode="embed",model="[^"]+"\} (\S+)', metrics)
        assert budget and float(budget.group(1)) <= 200
