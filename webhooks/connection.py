"""The urllib opener a delivery uses: no redirects, no proxies, pinned addresses.

NOTE: check_destination resolves the host, but urllib would resolve it again when it
connects; a DNS answer that changes in between (DNS rebinding) would slip past the
check. So the connection goes to the addresses that were checked, while the URL's
host name is still used for the Host header, TLS SNI and certificate verification.
Proxies are off for the same reason: a proxy would resolve the host itself.

Connecting has its own timeout: urllib's single ``timeout`` would let a black-holed
address hold a dispatcher for the whole read timeout. A connect timeout raises
ConnectTimeout, so an attempt's record says which phase timed out.
"""

from __future__ import annotations

import functools
import http.client
import socket
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

from webhooks.safety import IPAddress


class ConnectTimeout(TimeoutError):
    """No connection within the connect timeout (the read timeout never started)."""


class NoRedirect(urllib.request.HTTPRedirectHandler):
    # A redirect could lead past the destination check, so 3xx is reported as a failure.
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def build_opener(
    addresses: Sequence[IPAddress] = (), *, connect_timeout_s: float | None = None
) -> urllib.request.OpenerDirector:
    """An opener that connects only to ``addresses`` (the URL's host when empty).

    ``connect_timeout_s`` bounds connecting; the ``timeout`` given to ``open`` then
    bounds each read (urllib's own default uses one timeout for both).
    """
    pin = _Pin(tuple(addresses), connect_timeout_s)
    return urllib.request.build_opener(
        NoRedirect(), urllib.request.ProxyHandler({}), _PinnedHTTPHandler(pin), _PinnedHTTPSHandler(pin)
    )


@dataclass(frozen=True)
class _Pin:
    addresses: tuple[IPAddress, ...]  # connect only here; empty: resolve the URL's host
    connect_timeout_s: float | None  # None: the open() timeout bounds connecting too

    def connect(self, address, timeout=socket._GLOBAL_DEFAULT_TIMEOUT, source_address=None):
        # Same signature as socket.create_connection, which http.client calls.
        host, port = address
        targets = [str(pinned) for pinned in self.addresses] or [host]
        connect_timeout = timeout if self.connect_timeout_s is None else self.connect_timeout_s
        last_error: OSError | None = None
        for target in targets:
            try:
                sock = socket.create_connection((target, port), connect_timeout, source_address)
            except TimeoutError:
                last_error = ConnectTimeout(f"connect timed out after {connect_timeout}s")
            except OSError as exc:
                last_error = exc
            else:
                sock.settimeout(None if timeout is socket._GLOBAL_DEFAULT_TIMEOUT else timeout)
                return sock
        raise last_error or OSError("no address to connect to")


class _PinnedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args, pin: _Pin, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # http.client opens every socket through this attribute (HTTPS too, before TLS).
        self._create_connection = pin.connect


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *args, pin: _Pin, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = pin.connect


class _PinnedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, pin: _Pin) -> None:
        super().__init__()
        self._pin = pin

    def http_open(self, req):
        return self.do_open(functools.partial(_PinnedHTTPConnection, pin=self._pin), req)


class _PinnedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, pin: _Pin) -> None:
        super().__init__()
        self._pin = pin

    def https_open(self, req):
        connection_class = functools.partial(_PinnedHTTPSConnection, pin=self._pin)
        return self.do_open(connection_class, req, context=self._context)
