"""A same-host forwarding proxy: every byte relayed as it is, both ways, as `ssh -L`,
socat or a sidecar does. A request reaches the server from 127.0.0.1 whoever sent it,
which is what made "loopback sees everything" the operator's view for every outside
caller (issue 40)."""

from __future__ import annotations

import socket
import threading


class ForwardingProxy:
    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self._stopped = threading.Event()

    def __enter__(self) -> ForwardingProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stopped.set()
        self.listener.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_relay, args=(source, sink), daemon=True).start()


def _relay(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(1 << 16):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
