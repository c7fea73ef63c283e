"""A real Barge deployment for end-to-end tests: settings for one backend (embedded,
PostgreSQL + RabbitMQ, PostgreSQL + Redis) and worker processes started with
`python -m cli worker`, exactly as a user starts them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.forkserver import ForkedProcess, spawn_cli

POSTGRES_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672//"
REDIS_URL = "redis://127.0.0.1:6379/9"

BACKENDS = ("embedded", "postgres-rabbitmq", "postgres-redis")
# The machine's services each backend uses: a test on one is marked so (make test runs
# those tests apart from the `serial` ones, which stop the services).
SERVICES = {"embedded": (), "postgres-rabbitmq": ("postgres", "rabbitmq"), "postgres-redis": ("postgres", "redis")}


def backend_params(*backends: str) -> list:
    """pytest.parametrize values for these backends, each marked with the services it uses."""
    import pytest
    return [pytest.param(backend, marks=[getattr(pytest.mark, service) for service in SERVICES[backend]])
            for backend in backends]


@dataclass
class Stack:
    backend: str
    env: dict[str, str]                       # BARGE_* settings for this deployment
    data_dir: Path
    workers: list[subprocess.Popen | ForkedProcess] = field(default_factory=list)

    def client(self):
        from jobs.client import Client
        from jobs.settings import Settings
        return Client(settings=Settings.from_env(self.env))

    def start_worker(self, model: str = "minilm", *, timeout_s: float = 180.0,
                     env: dict[str, str] | None = None,
                     metrics_port: int | None = None) -> subprocess.Popen | ForkedProcess:
        process = self.spawn_worker(model, env=env, metrics_port=metrics_port)
        wait_ready(process, timeout_s)
        return process

    def spawn_worker(self, model: str = "minilm", *, env: dict[str, str] | None = None,
                     metrics_port: int | None = None) -> subprocess.Popen | ForkedProcess:
        """A worker process, started and not waited for (see wait_ready)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.data_dir / f"worker-{len(self.workers)}.log"
        env = {**os.environ, **self.env, **(env or {})}
        metrics = ["--metrics-port", str(metrics_port)] if metrics_port is not None else []
        # forked from the test process's warm fork server where its environment allows
        process = spawn_cli(["worker", "--model", model, *metrics], env=env, log_path=log_path)
        self.workers.append(process)
        return process

    def stop_workers(self) -> None:
        for process in self.workers:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.workers:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.workers.clear()

    def worker_logs(self) -> str:
        return "\n".join(Path(p.log_path).read_text()[-3000:] for p in self.workers)

    def spawn(self, argv: list[str], log_name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Any other process of this deployment (barge serve, a CLI; a worker, as spawn_worker starts
        one), its output in data_dir/log_name."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.data_dir / log_name
        if argv[:4] == [sys.executable, "-m", "cli", "worker"]:
            return spawn_cli(argv[3:], env={**os.environ, **self.env, **(env or {})}, log_path=log_path)
        process = subprocess.Popen(argv, env={**os.environ, **self.env, **(env or {})}, stdout=open(log_path, "wb"),
                                   stderr=subprocess.STDOUT)
        process.log_path = log_path
        return process

    def login_url(self, server: subprocess.Popen, timeout_s: float = 60.0) -> str:
        """The one-time operator login URL `barge serve` printed at start."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in Path(server.log_path).read_text().splitlines():
                if "/dashboard/login?ticket=" in line:
                    return line[line.index("http"):].strip()
            time.sleep(0.1)
        raise RuntimeError(f"barge serve printed no login URL:\n{Path(server.log_path).read_text()[-3000:]}")

    def create_api_key(self, name: str, *, operator: bool = False) -> str:
        """A new API key, made with `barge api-key create` as an operator does."""
        done = subprocess.run([sys.executable, "-m", "cli", "api-key", "create", "--name", name,
                               *(["--operator"] if operator else [])],
                              env={**os.environ, **self.env}, capture_output=True, text=True, check=True)
        return done.stdout.strip().splitlines()[-1]


def wait_ready(process: subprocess.Popen, timeout_s: float = 180.0) -> None:
    """Until the worker logs that Celery is ready; RuntimeError with its log if it exits first."""
    deadline = time.monotonic() + timeout_s
    while b" ready." not in Path(process.log_path).read_bytes():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"worker did not start:\n{Path(process.log_path).read_text()[-4000:]}")
        time.sleep(0.2)


def wait_until(predicate, timeout_s: float = 120.0, what: str = "condition"):
    """predicate's first truthy value, polled every 0.1 s; AssertionError naming `what` at the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for a worker's metrics server)."""
    import socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def stack(backend: str, data_dir: Path, env: dict[str, str] | None = None):
    # BARGE_SINGLE_HOST: every process of a test deployment runs on this machine (jobs.hosts)
    env = {"BARGE_DATA_DIR": str(data_dir), "BARGE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1", "BARGE_SINGLE_HOST": "1",
           "BARGE_WEBHOOK_RETRY_BASE_S": "0.2", "BARGE_DISPATCH_INTERVAL_S": "0.5", **(env or {})}
    database = None
    if backend != "embedded":
        database = f"barge_test_{uuid.uuid4().hex[:10]}"
        _admin_sql(f'CREATE DATABASE "{database}"')
        env["BARGE_DATABASE_URL"] = f"postgresql://postgres@127.0.0.1:5432/{database}"
        env["BARGE_BROKER_URL"] = RABBITMQ_URL if backend == "postgres-rabbitmq" else REDIS_URL
        # Its own queues on the shared broker: concurrent test runs never take each
        # other's messages.
        env["BARGE_NAMESPACE"] = database
    deployment = Stack(backend=backend, env=env, data_dir=data_dir)
    try:
        yield deployment
    finally:
        deployment.stop_workers()
        if backend != "embedded":
            _delete_queues(env)
            _admin_sql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def _admin_sql(statement: str) -> None:
    import psycopg
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
        conn.execute(statement)


def _delete_queues(env: dict[str, str]) -> None:
    from jobs.settings import Settings
    from queueing.app import create_app
    from jobs.messaging import CONTROL_QUEUE, model_queue, queue_name
    settings = Settings.from_env(env)
    with create_app(settings).connection_for_write() as conn:
        for queue in (CONTROL_QUEUE, model_queue("all-MiniLM-L6-v2")):
            channel = conn.channel()   # a failed delete closes the channel on AMQP
            try:
                channel.queue_delete(queue_name(settings.namespace, queue))
            except Exception:   # never declared, or already gone
                pass
            finally:
                channel.close()
    if settings.broker_url.startswith("redis://"):
        import redis   # kombu keeps exchange bindings in keys of their own
        client = redis.Redis.from_url(settings.broker_url)
        for key in client.scan_iter(f"*{settings.namespace}*"):
            client.delete(key)
