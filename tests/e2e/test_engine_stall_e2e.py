"""A hung engine no longer holds its shard for ever (issue 41): real worker processes on
the embedded default, minilm's real weights.

- An engine thread blocked for ever in a wait that releases the GIL (the failpoint
  `hang_on_input`, as a CUDA synchronisation that never returns): its lease thread goes
  on renewing, so only the engine watchdog notices. The process exits with status 75
  after BARGE_ENGINE_STALL_S, its last heartbeat says why, a second worker re-runs the
  shard once the lease lapses, and the job ends with every row exactly once.
- An engine process stopped with SIGSTOP under `--devices cpu:2`: nothing in it runs, not
  even its watchdog, so its supervisor sees its progress file go quiet, kills it and
  starts a fresh one; the other engine process re-runs the shard.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from jobs import JobSpec, JobStatus, ShardStatus
from jobs.worker_beats import WorkerBeats
from queueing.stall import EXIT_ENGINE_STALLED
from tests.e2e.test_devices_e2e import FAST_RECOVERY, assert_every_row_once, engine_pids, start_supervisor, write_corpus
from tests.support.stack import stack, wait_until

POISON = "HANG-ON-THIS-ROW"
STALL = {**FAST_RECOVERY, "BARGE_ENGINE_STALL_S": "4", "BARGE_ENGINE_LOAD_STALL_S": "60"}


def test_an_engine_hung_in_a_call_is_abandoned_and_its_shard_runs_once_elsewhere(tmp_path):
    with stack("embedded", tmp_path / "barge", STALL) as deployment:
        # Given a corpus whose row 250 hangs the engine of a worker with the failpoint.
        folder = tmp_path / "corpus"
        folder.mkdir()
        texts = [POISON if i == 250 else f"Row {i} about barges" for i in range(300)]
        pq.write_table(pa.table({"doc_id": pa.array(range(300), pa.int64()), "text": texts}),
                       folder / "corpus.parquet", row_group_size=50)
        hung = deployment.start_worker(env={"BARGE_FAILPOINTS": f"hang_on_input={POISON}"})
        client = deployment.client()
        job = client.submit(JobSpec(mode="embed", model="minilm", input=str(folder), id_column="doc_id",
                                    output=str(tmp_path / "out"), max_rows_per_shard=50))
        # When its engine reaches the row, the watchdog ends the process (the lease thread
        # was renewing all along).
        wait_until(lambda: hung.poll() is not None, 120, "the hung worker to exit")
        hung_at = time.monotonic()
        log_text = Path(hung.log_path).read_text()
        assert hung.returncode == EXIT_ENGINE_STALLED, log_text[-3000:]
        assert "engine stalled: no engine step for" in log_text and "embed of" in log_text
        held = [s for s in client.store.list_shards(job.id) if s.status == ShardStatus.RUNNING]
        # the poisoned shard, still leased to the dead worker (and any shard it had read ahead beside it)
        assert 5 in {s.shard_index for s in held} and len({s.worker_id for s in held}) == 1, held
        beat = next(b for b in WorkerBeats(client.store.engine).list() if b.id == held[0].worker_id)
        assert beat.stopped_at is not None and all("no engine step" in (e.stall or "") for e in beat.engines)
        # Then a healthy worker takes the shard once its lease lapses, and every row lands once.
        deployment.start_worker()
        state = job.wait(timeout=180)
        recovered_s = time.monotonic() - hung_at
        assert state.status == JobStatus.SUCCEEDED, deployment.worker_logs()
        table = job.results()
        assert sorted(table.column("doc_id").to_pylist()) == list(range(300))
        assert all(error is None for error in table.column("error").to_pylist())
        for shard in held:
            redone = next(s for s in client.store.list_shards(job.id) if s.shard_index == shard.shard_index)
            assert redone.worker_id != shard.worker_id and redone.attempt == 2
        print(f"job done {recovered_s:.1f} s after the stalled worker exited (lease 3 s, second worker's start "
              "included)")


def test_a_stopped_engine_process_is_killed_and_replaced_by_its_supervisor(tmp_path):
    with stack("embedded", tmp_path / "barge", {**STALL, "BARGE_ENGINE_STALL_S": "5"}) as deployment:
        write_corpus(tmp_path / "corpus", 3000)
        supervisor = start_supervisor(deployment, "cpu:2")
        pids = engine_pids(supervisor.log_path.read_text())
        client = deployment.client()
        job = client.submit(JobSpec(mode="embed", model="minilm", input=str(tmp_path / "corpus"), id_column="doc_id",
                                    output=str(tmp_path / "out"), max_rows_per_shard=50))
        held = wait_until(lambda: next((s for s in client.store.list_shards(job.id)
                                        if s.status == ShardStatus.RUNNING), None), 120, "a running shard")
        victim = int(held.worker_id.rsplit(":", 1)[1])
        victim_slot = next(slot for slot, slot_pids in pids.items() if victim in slot_pids)
        os.kill(victim, signal.SIGSTOP)   # alive, holding its shard, and doing nothing, its watchdog included
        try:
            wait_until(lambda: len(engine_pids(supervisor.log_path.read_text())[victim_slot]) == 2, 120,
                       "the supervisor to replace the stopped process")
        finally:
            try:
                os.kill(victim, signal.SIGCONT)   # if it is still there, let it go on (or die) normally
            except ProcessLookupError:
                pass
        log_text = supervisor.log_path.read_text()
        assert f"engine process {victim_slot} (pid {victim}) made no progress for" in log_text, log_text[-4000:]
        assert f"engine process {victim_slot} exited with status -9; restarting it" in log_text
        state = job.wait(timeout=300)
        assert state.status == JobStatus.SUCCEEDED, supervisor.log_path.read_text()[-4000:]
        assert_every_row_once(job, 3000, tmp_path / "out")
        redone = next(s for s in client.store.list_shards(job.id) if s.shard_index == held.shard_index)
        assert redone.status == ShardStatus.COMMITTED and redone.worker_id != held.worker_id
        assert supervisor.poll() is None
