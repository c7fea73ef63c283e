"""A real webhook receiver whose behaviour a test switches at run time: answering 200,
answering 500, hanging past the sender's timeout, or not listening at all.

    with FlakyReceiver(hang_s=20) as receiver:
        receiver.set_mode(Mode.ERRORS)      # 500 to everything from now on
        receiver.go_down(); receiver.come_up()   # the port closed, then open again
        receiver.accepted()                 # the deliveries it answered 200 in time

Every request is recorded with how it was answered, so a test can tell a delivery the
sender saw succeed (ACCEPTED) from one it gave up on.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass

from tests.support.receiver import Answer, WebhookReceiver


class Mode(enum.Enum):
    OK = "ok"
    ERRORS = "errors"
    HANGS = "hangs"


@dataclass(frozen=True)
class Delivery:
    headers: dict[str, str]
    body: bytes
    mode: Mode       # how it was answered: OK is the only answer the sender counts as delivered


class FlakyReceiver(WebhookReceiver):
    def __init__(self, *, hang_s: float = 20.0) -> None:
        super().__init__()
        self.hang_s = hang_s   # longer than the sender's read timeout
        self.mode = Mode.OK
        self.deliveries: list[Delivery] = []
        self._mode_lock = threading.Lock()
        self.is_down = False

    def set_mode(self, mode: Mode) -> None:
        with self._mode_lock:
            self.mode = mode

    def go_down(self) -> None:
        """Stop listening; the port is kept for come_up."""
        self.requested_port = self.port
        self.stop()
        self._server = None
        self.is_down = True

    def come_up(self) -> None:
        if self.is_down:
            self.start()
            self.is_down = False

    def accepted(self) -> list[Delivery]:
        with self._mode_lock:
            return [d for d in self.deliveries if d.mode is Mode.OK]

    def _record(self, path: str, headers: dict[str, str], body: bytes) -> Answer:
        super()._record(path, headers, body)
        with self._mode_lock:
            mode = self.mode
            self.deliveries.append(Delivery(headers, body, mode))
        if mode is Mode.ERRORS:
            return Answer(500)
        if mode is Mode.HANGS:
            return Answer(200, delay_s=self.hang_s)   # the sender has given up by then
        return Answer(200)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.requested_port or self.port}{self.path}"
