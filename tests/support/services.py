"""Stop and start the machine's real PostgreSQL, RabbitMQ and Redis, as an outage does.

They are shared by every test on the machine: whatever stops one must start it again,
also when it fails (`ensure_up` in a `finally`). Starting a service waits until it
answers on its port, so the caller's next step meets a server, not a half-started one.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time

PORTS = {"postgres": 5432, "rabbitmq": 5672, "redis": 6379}
PG_VERSION = next(iter(sorted(os.listdir("/etc/postgresql"))), "") if os.path.isdir("/etc/postgresql") else ""
REDIS_START = ["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379",
               "--save", "", "--appendonly", "no", "--dir", "/var/lib/redis", "--logfile", "/var/log/redis/ci.log"]


def can_control_services() -> bool:
    """Root, with the local PostgreSQL cluster and RabbitMQ's and Redis's commands."""
    import shutil
    return (os.geteuid() == 0 and bool(PG_VERSION)
            and all(shutil.which(c) for c in ("pg_ctlcluster", "rabbitmqctl", "redis-server", "redis-cli")))


def is_listening(service: str) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", PORTS[service]), timeout=1):
            return True
    except OSError:
        return False


def stop(service: str) -> None:
    if service == "postgres":
        _run(["pg_ctlcluster", "--skip-systemctl-redirect", PG_VERSION, "main", "stop", "-m", "fast"])
    elif service == "rabbitmq":
        _run(["rabbitmqctl", "stop_app"])
    elif service == "redis":
        _run(["redis-cli", "-p", "6379", "shutdown", "nosave"], check=False)   # it drops the connection
    else:
        raise ValueError(f"unknown service {service!r}")


def start(service: str, timeout_s: float = 120.0) -> None:
    if service == "postgres":
        _run(["pg_ctlcluster", "--skip-systemctl-redirect", PG_VERSION, "main", "start"], check=False)
    elif service == "rabbitmq":
        if _run(["rabbitmqctl", "start_app"], check=False).returncode != 0:
            _run(["rabbitmq-server", "-detached"], check=False)   # the node itself was down
    elif service == "redis":
        if not is_listening("redis"):
            _run(REDIS_START, check=False)
    else:
        raise ValueError(f"unknown service {service!r}")
    wait_listening(service, timeout_s)


def wait_listening(service: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not is_listening(service):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{service} is not listening on 127.0.0.1:{PORTS[service]} after {timeout_s:.0f}s")
        time.sleep(0.2)


def ensure_up(services=("postgres", "rabbitmq", "redis")) -> list[str]:
    """Start whichever of them is down; returns the ones that were."""
    down = [service for service in services if not is_listening(service)]
    for service in down:
        start(service)
    return down


def _run(command: list[str], check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(command, check=check, timeout=120, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
