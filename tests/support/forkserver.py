"""Worker processes forked from a warm parent instead of started cold.

The suite starts over a hundred `python -m cli worker` processes, and most of a start is
importing the same libraries (torch alone is about 1.5 s of CPU of a MiniLM worker's 2.8).
The suite is CPU-bound on the 2-core machine, so each test process keeps one fork server:
a Python process that has imported those libraries, and forks a child that runs
`python -m cli ARGS` as the interpreter would (`runpy`, the given environment, working
folder and log file, an interpreter's signal dispositions) from there on.

Only third-party libraries are imported ahead, by a server started with the child's
environment: the child's may differ from its server's only in BARGE_ settings (Barge reads
those when it runs, never at import), so a test whose workers need another HF_HOME,
AWS_* or PYTHONPATH gets a server of its own.

    process = spawn_cli(["worker", "--model", "minilm"], env=env, log_path=path)
    process.poll(); process.send_signal(signal.SIGTERM); process.wait(timeout=15)

The child is the server's child, not the test's: the server reaps it and writes its exit
code (Popen's convention: -N for signal N) where the handle reads it.

Measured (2-core AMD EPYC, 2026-12-07): tests/e2e/test_broker_resilience.py's three
service-free tests, 13 worker starts, took 146.8 s of the machine's CPU started cold and
107.6 s forked (/proc/stat before and after).
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path

# What a worker imports that costs. Not pyarrow: its import starts a thread (jemalloc's), which
# a fork would copy mid-lock.
PRELOAD = ("torch", "numpy", "fsspec", "sqlalchemy",
           "sqlalchemy.orm", "alembic", "celery", "celery.bin.celery", "kombu", "psycopg", "redis", "psutil",
           "tokenizers", "safetensors", "prometheus_client", "jinja2", "pygments", "yaml")
# Set to 0 and every process starts cold (to compare, or to rule the server out).
ENABLED_VARIABLE = "BARGE_TEST_FORKSERVER"
_READY = b"ready\n"


# -- the test's side ---------------------------------------------------------------------

class ForkedProcess:
    """The part of subprocess.Popen that tests use, for a child of the fork server."""

    def __init__(self, pid: int, args: list[str], status_path: Path, log_path: Path):
        self.pid, self.args, self.log_path = pid, args, log_path
        self.returncode: int | None = None
        self.stdin = self.stdout = self.stderr = None
        self._status_path = status_path

    def poll(self) -> int | None:
        if self.returncode is None and self._status_path.exists():
            self.returncode = int(self._status_path.read_text())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:   # exited; the server has not yet written its code
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Server:
    """A fork server for one environment (apart from BARGE_ settings), started by the test."""

    def __init__(self, env: dict[str, str]):
        self.folder = Path(tempfile.mkdtemp(prefix="barge-forkserver-"))
        self.socket_path = self.folder / "socket"
        repo = Path(__file__).resolve().parents[2]
        self.process = subprocess.Popen([sys.executable, "-m", "tests.support.forkserver", str(self.socket_path)],
                                        cwd=repo, env=env, stdout=subprocess.PIPE,
                                        stderr=open(self.folder / "server.log", "wb"))
        if self.process.stdout.readline() != _READY:
            self.process.kill()
            self.process.wait()
            raise RuntimeError(f"fork server did not start: {(self.folder / 'server.log').read_text()[-2000:]}")
        self.lock = threading.Lock()
        self.children: list[ForkedProcess] = []

    def is_idle(self) -> bool:
        return all(child.poll() is not None for child in self.children)

    def fork(self, args: list[str], env: dict[str, str], cwd: str, log_path: Path) -> ForkedProcess:
        status_path = self.folder / f"exit-{uuid.uuid4().hex}"
        open(log_path, "wb").close()   # there, and empty, before the call returns (as Popen's)
        request = {"args": args, "env": env, "cwd": cwd, "log_path": str(log_path), "status_path": str(status_path)}
        with self.lock, socket.socket(socket.AF_UNIX) as conn:
            conn.connect(str(self.socket_path))
            conn.sendall(json.dumps(request).encode() + b"\n")
            answer = conn.makefile("rb").readline()
        if not answer:
            raise RuntimeError(f"fork server gave no pid: {(self.folder / 'server.log').read_text()[-2000:]}")
        child = ForkedProcess(int(answer), [sys.executable, "-m", "cli", *args], status_path, log_path)
        self.children.append(child)
        return child

    def close(self) -> None:
        """Ends the server; the children it forked run on (their exit codes are then not
        recorded: the suite has stopped them by the time its process exits)."""
        self.process.terminate()
        self.process.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)


# One server per environment the test process has asked for, keyed by everything but the
# BARGE_ settings: a test that sets HF_HOME or AWS_* for its workers gets a server of its
# own. At most MAX_SERVERS: beyond, the least recently used one whose children have all
# exited is closed (one that still has some keeps serving, and reaping, them).
MAX_SERVERS = 3
_servers: OrderedDict[frozenset, _Server] = OrderedDict()
_servers_lock = threading.Lock()
_failed_to_start: list[str] = []    # a server that would not start: cold starts from then on


@atexit.register
def _close_servers() -> None:
    for server in list(_servers.values()):
        server.close()


def _signature(env: dict[str, str]) -> frozenset:
    return frozenset((key, value) for key, value in env.items()
                     if not key.startswith("BARGE_") and key != "PYTEST_CURRENT_TEST")


def _server_for(env: dict[str, str]) -> _Server | None:
    key = _signature(env)
    with _servers_lock:
        if _failed_to_start:
            return None
        server = _servers.get(key)
        if server is not None:
            _servers.move_to_end(key)
            return server if server.process.poll() is None else None   # died: cold starts, for this environment
        idle = [other for other, each in _servers.items() if each.is_idle()]
        while len(_servers) >= MAX_SERVERS and idle:
            _servers.pop(idle.pop(0)).close()
        if len(_servers) >= MAX_SERVERS:
            return None
        try:
            server = _Server(env)
        except (RuntimeError, OSError) as error:   # an optimisation only: start cold, and say why
            print(f"fork server: {error}; starting workers cold", file=sys.stderr)
            _failed_to_start.append(str(error))
            return None
        _servers[key] = server
        return server


def spawn_cli(args: list[str], *, env: dict[str, str], log_path: Path, cwd: str | None = None):
    """`python -m cli ARGS`, output (and errors) to log_path: forked from a warm server for
    this environment, else (BARGE_TEST_FORKSERVER=0, or MAX_SERVERS all with live children)
    a cold subprocess.Popen. Either has .log_path."""
    cwd = cwd or os.getcwd()
    if os.environ.get(ENABLED_VARIABLE, "1") != "0" and sys.platform == "linux":
        server = _server_for(env)
        if server is not None:
            return server.fork(args, env, cwd, log_path)
    process = subprocess.Popen([sys.executable, "-m", "cli", *args], env=env, cwd=cwd,
                               stdout=open(log_path, "wb"), stderr=subprocess.STDOUT)
    process.log_path = log_path
    return process


# -- the server's side -------------------------------------------------------------------

def _serve(socket_path: str) -> None:
    import importlib
    for name in PRELOAD:
        importlib.import_module(name)
    if threading.active_count() != 1 or len(os.listdir("/proc/self/task")) != 1:
        raise SystemExit("a preloaded library started a thread: forking would copy a half-held lock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(socket_path)
    listener.listen(16)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    parent = os.getppid()
    sys.stdout.buffer.write(_READY)
    sys.stdout.flush()
    while os.getppid() == parent:
        for key, _ in selector.select(timeout=1.0):
            if key.data is None:
                conn, _ = listener.accept()
                with conn:
                    request = json.loads(conn.makefile("rb").readline())
                    pid = os.fork()
                    if pid == 0:     # the child keeps none of the server's descriptors
                        for registered in list(selector.get_map().values()):
                            if registered.data is not None:     # the other children's pidfds
                                os.close(registered.fd)
                        selector.close()
                        listener.close()
                        conn.close()
                        _run_child(request)   # never returns
                    conn.sendall(f"{pid}\n".encode())
                selector.register(os.pidfd_open(pid), selectors.EVENT_READ, (pid, request["status_path"]))
            else:   # a child exited
                pid, status_path = key.data
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status, usage = os.wait4(pid, 0)
                # The child's CPU, for tests/support/cpu_profile.py, written before its exit code
                Path(status_path + ".cpu").write_text(f"{usage.ru_utime + usage.ru_stime:.3f}")
                partial = status_path + ".partial"
                Path(partial).write_text(str(os.waitstatus_to_exitcode(status)))
                os.replace(partial, status_path)


def _run_child(request: dict) -> None:
    """What `python -m cli ARGS` does, from this already-started interpreter."""
    code = 1
    try:
        # Signal dispositions stay as the server's, which are an interpreter's at start (it sets
        # none): SIGINT raises KeyboardInterrupt, SIGPIPE and SIGXFSZ ignored (a write to a
        # closed socket raises BrokenPipeError instead of killing the process), the rest default.
        log = os.open(request["log_path"], os.O_WRONLY | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        import numpy
        numpy.random.seed()   # its own seed, as a started process has (random reseeds itself at fork)
        import runpy
        sys.argv = ["-m", *request["args"]]
        try:
            runpy.run_module("cli", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        threading._shutdown()   # as the interpreter does at exit: join the non-daemon threads
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


if __name__ == "__main__":
    _serve(sys.argv[1])
