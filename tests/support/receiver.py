"""A real HTTP server on 127.0.0.1 that records webhook deliveries, for tests.

    with WebhookReceiver(responses=[500, 200]) as receiver:
        ...deliver to receiver.url twice...
        (headers, body), = receiver.wait_for(1)

Each answer is a status code, (status code, extra headers) to send e.g. Retry-After,
or an Answer, which can also be slow (delay_s) or held until the test releases it.
Answers are used in order; once they run out the receiver answers ``default_status``.
A receiver can listen on another loopback address (host="127.0.0.2") or on a given
port (to come up where a delivery was already failing).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Answer:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # sleep this long before answering (a slow receiver)
    hold: threading.Event | None = None  # answer only once this is set (or after 30 s)


Response = int | tuple[int, dict[str, str]] | Answer


class WebhookReceiver:
    def __init__(
        self, responses: Iterable[Response] = (), *, default_status: int = 200, path: str = "/hook",
        host: str = "127.0.0.1", port: int = 0, on_request: Callable[[bytes], None] | None = None,
    ) -> None:
        self.responses: list[Response] = list(responses)  # answers still to give, in order
        self.on_request = on_request  # called with each body as it arrives, before it is answered
        self.default_status = default_status
        self.path = path
        self.host = host
        self.requested_port = port
        self.requests: list[tuple[dict[str, str], bytes]] = []  # (headers, body) per request
        self.paths: list[str] = []  # request path per request, same order as requests
        self._lock = threading.Condition()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("WebhookReceiver is not started")
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self.path}"

    def start(self) -> WebhookReceiver:
        self._server = ThreadingHTTPServer((self.host, self.requested_port), self._handler_class())
        self._server.daemon_threads = True
        # A short poll interval keeps stop() (and so each test) fast.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def wait_for(self, num_requests: int, timeout_s: float = 5.0) -> list[tuple[dict[str, str], bytes]]:
        """Block until at least ``num_requests`` arrived; return a copy of all of them."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while len(self.requests) < num_requests:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"expected {num_requests} webhook requests, got {len(self.requests)}"
                    )
                self._lock.wait(remaining)
            return list(self.requests)

    def _record(self, path: str, headers: dict[str, str], body: bytes) -> Answer:
        if self.on_request is not None:
            self.on_request(body)
        with self._lock:
            self.requests.append((headers, body))
            self.paths.append(path)
            self._lock.notify_all()
            answer = self.responses.pop(0) if self.responses else self.default_status
        if isinstance(answer, Answer):
            return answer
        return Answer(*answer) if isinstance(answer, tuple) else Answer(answer)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                headers = {name.lower(): value for name, value in self.headers.items()}
                answer = receiver._record(self.path, headers, body)
                if answer.hold is not None:
                    answer.hold.wait(30)
                time.sleep(answer.delay_s)
                try:
                    self.send_response(answer.status)
                    for name, value in answer.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    pass  # the sender gave up (timed out, or was killed) meanwhile

            def log_message(self, format: str, *args) -> None:
                pass  # keep test output quiet

        return Handler
