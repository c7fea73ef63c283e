"""A reverse proxy on 127.0.0.1 that injects S3 faults in front of a real S3 API server.

    with FaultyProxy(s3.endpoint_url) as proxy:
        proxy.add(FaultRule(Fault.SLOWDOWN, times=3))                    # 503 SlowDown, 3 times
        proxy.add(FaultRule(Fault.DROP, method="GET", times=2))          # close without answering
        proxy.add(FaultRule(Fault.ERROR, method="POST", query="uploadId", times=1,
                            status=400, code="InvalidPart"))             # fail CompleteMultipartUpload
        ...point s3fs at proxy.endpoint_url...

Everything else is forwarded unchanged (Host and signatures included), one upstream
connection per request. `proxy.log` records every request and what was done to it,
so a test can show that the faults it asked for really happened, and `proxy.bytes_served`
counts the body bytes of the answers to GETs, per object: what the store served.
"""

from __future__ import annotations

import enum
import http.client
import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

# Headers that describe one hop, not the message: never forwarded as received.
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
                "proxy-connection", "expect", "content-length"}


class Fault(enum.Enum):
    SLOWDOWN = "slowdown"  # 503 with S3's SlowDown XML error: throttling, retried by botocore
    DROP = "drop"          # read the request, then close the socket without a byte of answer
    ERROR = "error"        # an S3 XML error of the rule's status and code


@dataclass
class FaultRule:
    """Fault the next `times` requests that match every given condition (None: any)."""

    fault: Fault
    method: str | None = None  # "GET", "PUT", "POST", "HEAD", ...
    path: str | None = None    # a substring of the request path (bucket/key)
    query: str | None = None   # a substring of the query, e.g. "uploads", "partNumber", "uploadId"
    times: int | None = 1      # None: every matching request, for ever
    status: int = 500          # for Fault.ERROR
    code: str = "InternalError"  # for Fault.ERROR

    def matches(self, method: str, path: str, query: str) -> bool:
        return ((self.method is None or self.method == method)
                and (self.path is None or self.path in path)
                and (self.query is None or self.query in query)
                and (self.times is None or self.times > 0))


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    fault: Fault | None  # what the proxy did instead of forwarding; None: forwarded


class FaultyProxy:
    def __init__(self, upstream_url: str) -> None:
        upstream = urlsplit(upstream_url)
        self.upstream = (upstream.hostname, upstream.port)
        self.rules: list[FaultRule] = []
        self.log: list[Request] = []
        self.served: dict[str, int] = {}  # request path (/bucket/key) -> body bytes of GET answers
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self.endpoint_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FaultyProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add(self, rule: FaultRule) -> FaultRule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()
            self.log.clear()
            self.served.clear()

    def faults(self, fault: Fault | None = None) -> list[Request]:
        """The requests that were faulted (of one kind, or any)."""
        with self._lock:
            return [r for r in self.log if r.fault is not None and (fault is None or r.fault == fault)]

    def bytes_served(self, path_prefix: str = "/") -> int:
        """Body bytes of the GET answers for objects whose path starts with `path_prefix`."""
        with self._lock:
            return sum(num_bytes for path, num_bytes in self.served.items() if path.startswith(path_prefix))

    def add_served(self, path: str, num_bytes: int) -> None:
        with self._lock:
            self.served[path] = self.served.get(path, 0) + num_bytes

    def requests(self, method: str | None = None, query: str | None = None) -> list[Request]:
        with self._lock:
            return [r for r in self.log if (method is None or r.method == method)
                    and (query is None or query in r.query)]

    def decide(self, method: str, path: str, query: str) -> FaultRule | None:
        """The first live rule that matches, its count taken; the request is logged."""
        with self._lock:
            rule = next((r for r in self.rules if r.matches(method, path, query)), None)
            if rule is not None and rule.times is not None:
                rule.times -= 1
            self.log.append(Request(method, path, query, rule.fault if rule else None))
            return rule


def _handler_for(proxy: FaultyProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(_ProxyHandler):
        pass
    Handler.proxy = proxy
    return Handler


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as clients expect of S3; also answers Expect: 100-continue
    proxy: FaultyProxy

    def do_GET(self): self._handle()
    def do_HEAD(self): self._handle()
    def do_PUT(self): self._handle()
    def do_POST(self): self._handle()
    def do_DELETE(self): self._handle()

    def log_message(self, *args) -> None:  # the test's output stays quiet
        pass

    def _handle(self) -> None:
        body = self._read_body()
        path, _, query = self.path.partition("?")
        rule = self.proxy.decide(self.command, path, query)
        if rule is None:
            self._forward(body)
        elif rule.fault is Fault.DROP:
            self._drop()
        elif rule.fault is Fault.SLOWDOWN:
            self._send_error(503, "SlowDown", "Please reduce your request rate.")
        else:
            self._send_error(rule.status, rule.code, "Injected by the test's faulty proxy.")

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _read_chunked(self) -> bytes:
        chunks = []
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip(), 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            chunks.append(self.rfile.read(size))
            self.rfile.readline()

    def _forward(self, body: bytes) -> None:
        upstream = http.client.HTTPConnection(*self.proxy.upstream, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
            headers["Content-Length"] = str(len(body))
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            self.send_response(response.status, response.reason)
            for name, value in response.getheaders():
                if name.lower() not in _HOP_HEADERS:
                    self.send_header(name, value)
            # A HEAD answer gives the object's size without its bytes.
            length = response.getheader("Content-Length") if self.command == "HEAD" else str(len(data))
            self.send_header("Content-Length", length or "0")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            if self.command == "GET":
                self.proxy.add_served(self.path.partition("?")[0], len(data))
        finally:
            upstream.close()

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _send_error(self, status: int, code: str, message: str) -> None:
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                f"<Message>{message}</Message><RequestId>faulty-proxy</RequestId></Error>").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
