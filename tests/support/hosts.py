"""Hosts that share nothing but the network, for the many-hosts test (issue 46).

Each process runs in its own mount namespace with a private tmpfs over /tmp, its HOME
and data dir under it, so whatever one host writes to its own disk no other host sees —
as on separate machines. What they share is what a real deployment shares: PostgreSQL,
the broker and an S3 API server on 127.0.0.1 (the network namespace is the machine's),
and the installed software (the repository and its virtualenv, outside /tmp).

    host = Host("client", shared_env, logs_dir)
    host.run(["barge", "submit", ...])          # python -m cli submit ..., in a fresh namespace
    worker = host.spawn(["worker", "--model", "minilm"], prelude="...")   # a long-lived process

Needs root (unshare -m, mount); the test skips with the reason otherwise.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HOME = "/tmp/home"          # inside each namespace
DATA_DIR = "/tmp/barge"


def can_isolate() -> str | None:
    """Why hosts cannot be isolated here, or None."""
    if os.geteuid() != 0:
        return "separate mount namespaces need root (unshare -m, mount -t tmpfs)"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                            "mount -t tmpfs tmpfs /tmp && test ! -e /tmp/.barge-probe"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"unshare -m failed: {probe.stderr.strip()}"


@dataclass
class Host:
    name: str
    env: dict[str, str]          # settings shared by every host, and this host's own
    logs: Path                   # on the test's side: each process's output, written through its fd

    def argv(self, barge_args: list[str], prelude: str = "") -> list[str]:
        """`python -m cli ARGS` in a new mount namespace with a private /tmp; `prelude`
        (shell) runs first inside it, e.g. to put a model on this host's disk alone."""
        command = " && ".join(filter(None, [
            "mount -t tmpfs tmpfs /tmp", f"mkdir -p -m 700 {HOME} {DATA_DIR}", prelude,
            f"exec {shlex.quote(sys.executable)} -m cli {shlex.join(barge_args)}"]))
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", command]

    def environment(self) -> dict[str, str]:
        return {**os.environ, **self.env, "HOME": HOME, "BARGE_DATA_DIR": DATA_DIR, "TMPDIR": "/tmp",
                "XDG_CACHE_HOME": f"{HOME}/.cache", "HF_HOME": f"{HOME}/.cache/huggingface"}

    def run(self, barge_args: list[str], *, timeout_s: float = 300, prelude: str = "") -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(barge_args, prelude), cwd=REPO, env=self.environment(), capture_output=True,
                              text=True, timeout=timeout_s)

    def spawn(self, barge_args: list[str], log_name: str, *, prelude: str = "") -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        log_path = self.logs / f"{self.name}-{log_name}.log"
        process = subprocess.Popen(self.argv(barge_args, prelude), cwd=REPO, env=self.environment(),
                                   stdout=open(log_path, "wb"), stderr=subprocess.STDOUT)
        process.log_path = log_path
        return process
