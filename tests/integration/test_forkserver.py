"""The suite's fork server (tests/support/forkserver.py) starts a worker that behaves as one
started cold: its environment, folder and log, SIGPIPE ignored as an interpreter has it (a
worker killed by SIGPIPE on a closed socket is how a reset signal disposition showed),
Popen's exit codes, and a server of its own for another environment."""

from __future__ import annotations

import os
import signal
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from jobs import JobSpec, JobStatus
from tests.support import forkserver
from tests.support.stack import stack, wait_ready


def _ignored_signals(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("SigIgn:"):
            return int(line.split()[1], 16)
    raise AssertionError("no SigIgn line")


def test_a_forked_worker_runs_as_a_cold_one_would(tmp_path):
    with stack("embedded", tmp_path / "earlier") as earlier:   # a server started for another data dir
        assert isinstance(earlier.start_worker(), forkserver.ForkedProcess)
    with stack("embedded", tmp_path / "barge") as deployment:
        worker = deployment.spawn_worker()
        assert isinstance(worker, forkserver.ForkedProcess)
        wait_ready(worker)
        ignored = _ignored_signals(worker.pid)
        assert ignored & (1 << (signal.SIGPIPE - 1)), "SIGPIPE ignored, as Python sets it at start"
        assert not ignored & (1 << (signal.SIGTERM - 1))
        assert os.readlink(f"/proc/{worker.pid}/cwd") == os.getcwd()
        # its environment is this deployment's (/proc/PID/environ shows the server's, as exec'd):
        # it takes this deployment's job
        corpus = tmp_path / "corpus.parquet"
        pq.write_table(pa.table({"doc_id": [1, 2], "text": ["one row", "another"]}), corpus)
        job = deployment.client().submit(JobSpec(mode="embed", model="minilm", input=str(corpus),
                                                 id_column="doc_id", output=str(tmp_path / "out")))
        assert job.wait(timeout=120).status == JobStatus.SUCCEEDED, deployment.worker_logs()

        other = deployment.spawn_worker(env={"BARGE_TEST_OTHER": "1"})   # a BARGE_ setting: the same server
        wait_ready(other)
        other.kill()
        assert other.wait(timeout=30) == -signal.SIGKILL
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, worker.log_path.read_text()[-2000:]
        assert len(forkserver._servers) >= 1


def test_another_environment_gets_a_server_of_its_own_and_a_failed_command_its_exit_code(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    env = dict(os.environ)
    before = set(forkserver._servers)
    process = forkserver.spawn_cli(["no-such-command"], env=env, log_path=tmp_path / "cli.log")
    assert isinstance(process, forkserver.ForkedProcess)
    assert process.wait(timeout=60) == 2, (tmp_path / "cli.log").read_text()    # argparse's usage error
    assert "invalid choice" in (tmp_path / "cli.log").read_text()
    assert forkserver._signature(env) in set(forkserver._servers) - before
    assert sys.executable in process.args


def test_a_server_that_will_not_start_leaves_workers_to_start_cold(tmp_path, monkeypatch, capsys):
    def refuse(env):
        raise RuntimeError("fork server did not start: a preloaded library started a thread")
    monkeypatch.setattr(forkserver, "_Server", refuse)
    monkeypatch.setattr(forkserver, "_servers", forkserver.OrderedDict())
    monkeypatch.setattr(forkserver, "_failed_to_start", [])
    process = forkserver.spawn_cli(["--help"], env=dict(os.environ), log_path=tmp_path / "help.log")
    assert not isinstance(process, forkserver.ForkedProcess)
    assert process.wait(timeout=60) == 0 and "usage" in (tmp_path / "help.log").read_text()
    assert "starting workers cold" in capsys.readouterr().err
    assert forkserver._failed_to_start     # and the next start does not try again
