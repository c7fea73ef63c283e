"""The suite's fork server (tests/support/forkserver.py) starts a worker that behaves as one
started cold: its environment, folder and log, SIGPIPE ignored as an interpreter has it (a
worker killed by SIGPIPE on a closed socket is how a reset signal disposition showed),
Popen's exit codes, and a server of its own for another environment."""

from __future__ import annotations

import os
import signal
import sys

from tests.support import forkserver
from tests.support.stack import stack, wait_ready


def _ignored_signals(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("SigIgn:"):
            return int(line.split()[1], 16)
    raise AssertionError("no SigIgn line")


def test_a_forked_worker_runs_as_a_cold_one_would(tmp_path):
    with stack("embedded", tmp_path / "barge") as deployment:
        worker = deployment.spawn_worker()
        assert isinstance(worker, forkserver.ForkedProcess)
        wait_ready(worker)
        ignored = _ignored_signals(worker.pid)
        assert ignored & (1 << (signal.SIGPIPE - 1)), "SIGPIPE ignored, as Python sets it at start"
        assert not ignored & (1 << (signal.SIGTERM - 1))
        environ = open(f"/proc/{worker.pid}/environ", "rb").read().split(b"\0")
        assert f"BARGE_DATA_DIR={deployment.data_dir}".encode() in environ
        assert os.readlink(f"/proc/{worker.pid}/cwd") == os.getcwd()

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
