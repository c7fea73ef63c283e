"""The urllib opener a delivery uses: no redirects, no proxies, pinned addresses.

NOTE: check_destination resolves the host, but urllib would resolve it again when it
connects; a DNS answer that changes in between (DNS rebinding) would slip past the
check. So the connection goes to the addresses that were checked, while the URL's
host name is still used for the Host header, TLS SNI and certificate verification.
Proxies are off for the same reason: a proxy would resolve the host itself.
"""

from __future__ import annotations

import functools
import http.client
import socket
import urllib.request
from collections.abc import Sequence

from webhooks.safety import IPAddress


class NoRedirect(urllib.request.HTTPRedirectHandler):
    # A redirect could lead past the destination check, so 3xx is reported as a failure.
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def build_opener(addresses: Sequence[IPAddress] = ()) -> urllib.request.OpenerDirector:
    """An opener that connects only to ``addresses`` (any host when empty)."""
    handlers: list[urllib.request.BaseHandler] = [NoRedirect(), urllib.request.ProxyHandler({})]
    if addresses:
        handlers += [_PinnedHTTPHandler(addresses), _PinnedHTTPSHandler(addresses)]
    return urllib.request.build_opener(*handlers)


def _connect_to_any(addresses, address, timeout=socket._GLOBAL_DEFAULT_TIMEOUT, source_address=None):
    # Same signature as socket.create_connection; the host in ``address`` is ignored.
    _, port = address
    last_error: OSError | None = None
    for pinned in addresses:
        try:
            return socket.create_connection((str(pinned), port), timeout, source_address)
        except OSError as exc:
            last_error = exc
    raise last_error or OSError("no address to connect to")


def _pin(connection: http.client.HTTPConnection, addresses: Sequence[IPAddress]) -> None:
    # http.client opens every socket through this attribute (HTTPS too, before TLS).
    connection._create_connection = functools.partial(_connect_to_any, addresses)


class _PinnedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args, addresses: Sequence[IPAddress], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _pin(self, addresses)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *args, addresses: Sequence[IPAddress], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _pin(self, addresses)


class _PinnedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, addresses: Sequence[IPAddress]) -> None:
        super().__init__()
        self._addresses = tuple(addresses)

    def http_open(self, req):
        return self.do_open(functools.partial(_PinnedHTTPConnection, addresses=self._addresses), req)


class _PinnedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, addresses: Sequence[IPAddress]) -> None:
        super().__init__()
        self._addresses = tuple(addresses)

    def https_open(self, req):
        connection_class = functools.partial(_PinnedHTTPSConnection, addresses=self._addresses)
        return self.do_open(connection_class, req, context=self._context)
