"""Each test's CPU, to see where `make test`'s time goes (the suite is CPU-bound on 2 cores).

Opt-in: `make test PYTEST_ARGS="-p tests.support.cpu_profile"` with BARGE_TEST_CPU_LOG set to
a folder. Each test process writes there one JSON line per test: its own CPU and that of the
children it reaped while the test ran (cold workers, `barge serve`, the CLI calls), plus the
CPU of the workers that the fork server forked for it (the server reaps those and writes
each one's CPU beside its exit code). Then `python -m tests.support.cpu_profile FOLDER`
prints the largest.

What it cannot see: a child still running when the test process ends, and the CPU of the
services (PostgreSQL, RabbitMQ, Redis). What each process spent outside its tests (collection,
the fork servers it started) it cannot split; it counts the fork servers each started.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.support import forkserver

LOG_VARIABLE = "BARGE_TEST_CPU_LOG"
_forked: list[tuple[str, Path]] = []     # (test, the child's exit-code file)
_current = {"test": ""}
_servers_started = [0]


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def pytest_configure(config):
    original = forkserver.ForkedProcess.__init__

    def recording_init(self, pid, args, status_path, log_path):
        original(self, pid, args, status_path, log_path)
        _forked.append((_current["test"], Path(status_path)))

    forkserver.ForkedProcess.__init__ = recording_init
    server_init = forkserver._Server.__init__

    def counting_init(self, env):
        _servers_started[0] += 1
        server_init(self, env)

    forkserver._Server.__init__ = counting_init
    config._cpu_rows = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _current["test"] = item.nodeid
    own, children = _cpu()
    started = time.monotonic()
    yield
    own_after, children_after = _cpu()
    item.config._cpu_rows.append({"test": item.nodeid, "start": time.time() - (time.monotonic() - started),
                                  "wall": time.monotonic() - started,
                                  "own": own_after - own, "children": children_after - children})


def pytest_sessionfinish(session):
    folder = os.environ.get(LOG_VARIABLE)
    if not folder:
        return
    forked = defaultdict(float)
    deadline = time.monotonic() + 10     # the server writes a child's CPU once it has reaped it
    for test, status_path in _forked:
        cpu_path = Path(str(status_path) + ".cpu")
        while not cpu_path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if cpu_path.exists():
            forked[test] += float(cpu_path.read_text())
    Path(folder).mkdir(parents=True, exist_ok=True)
    with open(Path(folder) / f"{os.getpid()}.jsonl", "w") as out:
        for row in session.config._cpu_rows:
            row["forked"] = forked.get(row["test"], 0.0)
            out.write(json.dumps(row) + "\n")
        out.write(json.dumps({"process": os.getpid(), "servers_started": _servers_started[0]}) + "\n")


def main(folder: str, top: int = 40) -> None:
    lines = [json.loads(line) for path in Path(folder).glob("*.jsonl") for line in path.read_text().splitlines()]
    rows = [line for line in lines if "test" in line]
    processes = [line for line in lines if "process" in line]
    for row in rows:
        row["cpu"] = row["own"] + row["children"] + row["forked"]
    total = sum(row["cpu"] for row in rows)
    by_file = defaultdict(float)
    for row in rows:
        by_file[row["test"].split("::")[0]] += row["cpu"]
    print(f"{len(rows)} tests, {total:.0f} s of CPU")
    if processes:
        # A process's own and children's totals are not summed here: a fork server it reaps
        # brings its forked workers' CPU, already counted per test, a second time.
        print(f"{len(processes)} test processes started {sum(p['servers_started'] for p in processes)} fork servers")
    print("\nby file:")
    for name, cpu in sorted(by_file.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{cpu:8.1f}  {name}")
    print("\nby test (cpu, wall, own, children, forked):")
    for row in sorted(rows, key=lambda row: -row["cpu"])[:top]:
        print(f"{row['cpu']:7.1f} {row['wall']:7.1f} {row['own']:7.1f} {row['children']:7.1f} {row['forked']:7.1f}  "
              f"{row['test']}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(arg) for arg in sys.argv[2:]))
