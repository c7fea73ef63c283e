"""The tests that make test runs beside the `serial` ones reach no shared service.

The `serial` tests stop the machine's PostgreSQL, RabbitMQ and Redis. make test runs them
at the same time as the tests marked neither `postgres`, `rabbitmq` nor `redis`, with
BARGE_TEST_WITHOUT_SERVICES=1: then `install()` refuses, in the test process, every
connection to those services (a psycopg connection, a socket to 127.0.0.1:5432, 5672 or
6379) as the server being down would, and records it; tests/conftest.py fails the test
that made it, naming the marker it lacks. A test that needs a service without saying so
fails every run, not only when a `serial` test happens to have the service stopped."""

from __future__ import annotations

import errno
import ipaddress
import socket
import threading

ENV = "BARGE_TEST_WITHOUT_SERVICES"
PORTS = {5432: "postgres", 5672: "rabbitmq", 6379: "redis"}
NAMES = {"postgres": "PostgreSQL", "rabbitmq": "RabbitMQ", "redis": "Redis"}

_reached: list[str] = []
_lock = threading.Lock()
_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    _guard_sockets()
    _guard_psycopg()


def take_reached() -> list[str]:
    """The services reached since the last call (markers: postgres, rabbitmq, redis)."""
    with _lock:
        reached = sorted(set(_reached))
        _reached.clear()
    return reached


def message(nodeid: str, reached: list[str], marked: set[str]) -> str:
    services = ", ".join(NAMES[name] for name in reached)
    missing = [name for name in reached if name not in marked]
    if not missing:
        return (f"{nodeid} connected to the machine's {services} while {ENV}=1: a test marked "
                f"{' '.join(reached)} runs only where the services are up (not with {ENV}=1).")
    marks = " ".join(f"@pytest.mark.{name}" for name in missing)
    return (f"{nodeid} connected to the machine's {services} while {ENV}=1, but is not marked so. "
            f"Mark it {marks}: make test runs it apart from the serial tests, which stop that service.")


def _refuse(service: str) -> None:
    with _lock:
        _reached.append(service)


def _is_loopback(host) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


def _service_at(address) -> str | None:
    if isinstance(address, tuple) and len(address) >= 2 and isinstance(address[1], int):
        service = PORTS.get(address[1])
        if service and _is_loopback(address[0]):
            return service
    return None


def _guard_sockets() -> None:
    connect, connect_ex = socket.socket.connect, socket.socket.connect_ex

    def guarded_connect(self, address):
        service = _service_at(address)
        if service:
            _refuse(service)
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"{ENV}=1: no {NAMES[service]} for this test")
        return connect(self, address)

    def guarded_connect_ex(self, address):
        service = _service_at(address)
        if service:
            _refuse(service)
            return errno.ECONNREFUSED
        return connect_ex(self, address)

    socket.socket.connect = guarded_connect
    socket.socket.connect_ex = guarded_connect_ex


def _guard_psycopg() -> None:
    try:
        import psycopg
    except ImportError:
        return

    def refused(*args, **kwargs):
        _refuse("postgres")
        raise psycopg.OperationalError(f"{ENV}=1: no PostgreSQL for this test")

    async def refused_async(*args, **kwargs):
        refused()

    psycopg.connect = refused
    psycopg.Connection.connect = classmethod(lambda cls, *args, **kwargs: refused())
    psycopg.AsyncConnection.connect = classmethod(lambda cls, *args, **kwargs: refused_async())
