"""Who is asking, decided on the request's headers before any body is read.

`barge serve` is the door a team opens to everyone who submits work, usually behind a
TLS proxy; whatever arrives is hostile until a key says otherwise. `Gate` is the
outermost ASGI middleware of the app, and for every request, in this order:

1. `Host` must name this server (`--allowed-host`; by default the bound address,
   localhost and 127.0.0.1): any other answers 400, which is what stops DNS rebinding.
2. The credential is read from the headers only: `Authorization: Bearer <key>`, or, on
   the dashboard, its session cookie (jobs.dashboard_sessions). A key in a query string
   is never looked at (and never logged: api.serve strips query strings from the access log).
3. A request that needs a credential and has no usable one is answered 401 in OpenAI's
   shape at once: its body is never read, parsed or spooled. At d9a7a84 FastAPI parsed a
   keyless 24 MB JSON body before its 401: +655 MB of peak memory and 0.47 s here
   (bench/keyless_body_bench.py, 2-core AMD EPYC), +0 MB and 0.01 s now; the probes are
   in tests/e2e/test_serve_security.py.

Only these need no credential: the dashboard's static files, its login form (a POST of
at most LOGIN_MAX_BYTES, from this server's own origin) and its HTML pages, which answer
the login form to a visitor without one. Nobody is trusted by address: the operator's
view of every key's jobs takes an operator key or the one-time login URL that
`barge serve` prints (`LoginTicket`). The credential found is left in
`scope["state"]["principal"]` for the routes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
from dataclasses import dataclass
from collections.abc import Mapping
from urllib.parse import urlsplit

import anyio.to_thread
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from api.errors import ApiError
from api.upload import BodyLimit
from jobs.api_keys import ApiKey, ApiKeys
from jobs.dashboard_sessions import DashboardSessions

DASHBOARD = "/dashboard"
SESSION_COOKIE = "barge_session"
LOGIN_MAX_BYTES = 4096          # the login form: one key field
DEFAULT_ALLOWED_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class Principal:
    """A caller who showed a usable credential."""

    key: ApiKey | None           # None: the operator, by the one-time login URL
    is_operator: bool            # sees every key's jobs on the dashboard
    session_id: str | None = None   # the dashboard session it came by, if any


class LoginTicket:
    """The one-time login URL's secret: redeemed once, for an operator session; it lives
    only in this server process. Printed by `barge serve` at start, as Jupyter prints its
    token; a restart prints a new one."""

    def __init__(self, token: str | None = None):
        self.token = token or secrets.token_urlsafe(32)
        self._digest: bytes | None = hashlib.sha256(self.token.encode()).digest()
        self._lock = threading.Lock()

    def redeem(self, presented: str) -> bool:
        digest = hashlib.sha256(presented.encode()).digest()
        with self._lock:
            if self._digest is None or not hmac.compare_digest(digest, self._digest):
                return False
            self._digest = None
            return True


def allowed_hosts_for(bound_host: str, extra: list[str] | tuple[str, ...] = ()) -> tuple[str, ...]:
    """The `Host` names answered: the bound address (unless a wildcard address), the
    loopback names, and the operator's own (`--allowed-host`, e.g. the proxy's public name)."""
    hosts = list(DEFAULT_ALLOWED_HOSTS)
    if bound_host not in ("0.0.0.0", "::", ""):
        hosts.append(bound_host)
    hosts.extend(extra)
    return tuple(dict.fromkeys(host.strip().lower().strip("[]") for host in hosts if host.strip()))


def host_name(host_header: str) -> str:
    """`Host`'s name without its port: "example.com:8000" -> "example.com", "[::1]:80" -> "::1"."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def host_allowed(name: str, allowed: tuple[str, ...]) -> bool:
    return any(entry == "*" or entry == name or (entry.startswith("*.") and name.endswith(entry[1:]))
               for entry in allowed) and bool(name)


class Gate:
    def __init__(self, app: ASGIApp, keys: ApiKeys, sessions: DashboardSessions, allowed_hosts: tuple[str, ...]):
        self.app = app
        self.keys = keys
        self.sessions = sessions
        self.allowed_hosts = allowed_hosts
        self.login_app = BodyLimit(app, LOGIN_MAX_BYTES)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        connection = HTTPConnection(scope)   # headers and cookies only: nothing here reads the body
        headers = connection.headers
        if not host_allowed(host_name(headers.get("host", "")), self.allowed_hosts):
            await _refuse(send, ApiError(400, "this server does not answer for that Host; the operator lists the "
                                              "names it answers with `barge serve --allowed-host`", code="invalid_host"))
            return
        path, method = scope["path"], scope["method"]
        dashboard = path == DASHBOARD or path.startswith(DASHBOARD + "/")
        if dashboard and method not in ("GET", "HEAD") and not _same_origin(headers):
            await _refuse(send, ApiError(403, "a dashboard form must come from this server's own pages "
                                              "(its Origin did not match)", code="cross_origin"))
            return
        principal, problem = await anyio.to_thread.run_sync(self._principal, connection, dashboard)
        scope.setdefault("state", {})["principal"] = principal
        scope["state"]["credential_problem"] = problem
        if principal is None and not _open(path, method):
            message = problem or "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'."
            await _refuse(send, ApiError(401, message, code="invalid_api_key" if problem else None))
            return
        if path == f"{DASHBOARD}/login" and method == "POST":
            await self.login_app(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _principal(self, connection: HTTPConnection, dashboard: bool) -> tuple[Principal | None, str | None]:
        """The caller's credential (a key, or on the dashboard a session), and why a presented
        one was refused. Runs on a worker thread: it asks the database."""
        scheme, _, token = connection.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            key = self.keys.authenticate(token.strip())
            if key is None:
                return None, "Incorrect API key provided."
            return Principal(key, key.is_operator), None
        session_id = connection.cookies.get(SESSION_COOKIE) if dashboard else None
        if session_id:
            session = self.sessions.find(session_id)
            if session is None:
                return None, "your dashboard session has ended; log in again"
            return Principal(session.key, session.is_operator, session_id), None
        return None, None


def _open(path: str, method: str) -> bool:
    """What a visitor without a credential may ask for: never a body beyond the login form's."""
    if method in ("GET", "HEAD"):
        return path.startswith(f"{DASHBOARD}/static/") or (
            path.startswith(DASHBOARD) and not path.startswith(f"{DASHBOARD}/api/"))
    return path == f"{DASHBOARD}/login" and method == "POST"


def _same_origin(headers: Mapping[str, str]) -> bool:
    """A browser's POST from this server's own page: its `Origin` (or `Referer`) names this
    server's host and port, or, where the browser sends `Origin: null` (Chromium does under
    a no-referrer policy), its `Sec-Fetch-Site` says same-origin, which no page of another
    site can make it say. The scheme is not compared: behind a TLS proxy the page's https
    origin posts to a plain-http server."""
    origin = headers.get("origin") or headers.get("referer") or ""
    if origin and origin != "null":
        return urlsplit(origin).netloc.lower() == headers.get("host", "").strip().lower()
    return headers.get("sec-fetch-site") == "same-origin"


async def _refuse(send: Send, error: ApiError) -> None:
    data = json.dumps(error.body()).encode()
    await send({"type": "http.response.start", "status": error.status_code,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            (b"connection", b"close"), (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": data})
