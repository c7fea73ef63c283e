"""Webhook URL checks: syntax at submit time, destination address at delivery time.

A webhook URL is user input that makes our workers send requests, so a job must not
be able to aim them at the cloud metadata service, at localhost or at the private
network the workers sit in (SSRF). Internal receivers are opted in explicitly, by
host name or address, through ``allow_hosts`` or ``BARGE_WEBHOOK_ALLOW_HOSTS``.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Collection, Mapping
from urllib.parse import urlsplit

MAX_URL_LENGTH = 2048
ALLOWED_SCHEMES = ("http", "https")
ALLOW_HOSTS_ENV = "BARGE_WEBHOOK_ALLOW_HOSTS"
DEFAULT_PORTS = {"http": 80, "https": 443}

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class UnsafeDestinationError(ValueError):
    """The webhook URL points somewhere workers must not send requests."""


def validate_webhook_url(url: str) -> None:
    """Syntactic check, no network: raise ValueError("webhook_url: ...") on a bad URL."""
    if not isinstance(url, str) or not url:
        raise ValueError("webhook_url: must be a non-empty string")
    if len(url) >= MAX_URL_LENGTH:
        raise ValueError(f"webhook_url: too long ({len(url)} >= {MAX_URL_LENGTH} characters)")
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        raise ValueError("webhook_url: contains whitespace or control characters")
    parts = urlsplit(url)
    if parts.scheme.lower() not in ALLOWED_SCHEMES:
        raise ValueError(f"webhook_url: scheme must be http or https, not {parts.scheme!r}")
    if parts.username is not None or parts.password is not None:
        raise ValueError("webhook_url: must not contain user credentials (user:pass@)")
    if not parts.hostname:
        raise ValueError("webhook_url: has no host")
    try:
        parts.port
    except ValueError:
        raise ValueError("webhook_url: has an invalid port") from None


def allow_hosts_from_env(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    raw = environ.get(ALLOW_HOSTS_ENV, "")
    return tuple(entry.strip() for entry in raw.split(",") if entry.strip())


def is_public_address(address: IPAddress) -> bool:
    """True only for globally routable unicast addresses."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    # is_global alone already excludes most of these; the explicit list keeps the
    # intent readable and covers ranges whose is_global changed across Python versions.
    # 169.254.169.254 (cloud metadata) is link-local.
    is_special = (
        address.is_loopback
        or address.is_private
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
    )
    return address.is_global and not is_special


def check_destination(url: str, *, allow_hosts: Collection[str] = ()) -> None:
    """Resolve the URL's host and refuse non-public addresses unless allow-listed.

    Raises UnsafeDestinationError for a bad URL or a refused address. A host that does
    not resolve raises OSError (socket.gaierror): that may be transient, so callers
    retry it rather than give up.
    """
    checked_addresses(url, allow_hosts=allow_hosts)


def checked_addresses(url: str, *, allow_hosts: Collection[str] = ()) -> tuple[IPAddress, ...]:
    """check_destination, returning the addresses that passed, for the sender to pin.

    Connecting to exactly these addresses (not resolving again) closes the DNS
    rebinding gap between check and connect. Empty when the host is allow-listed by
    name: then nothing was resolved and the sender connects as usual.
    """
    try:
        validate_webhook_url(url)
    except ValueError as exc:
        raise UnsafeDestinationError(str(exc)) from None
    parts = urlsplit(url)
    host = parts.hostname or ""
    allowed = tuple(allow_hosts) + allow_hosts_from_env()
    if _is_allowed(host, None, allowed):
        return ()
    port = parts.port or DEFAULT_PORTS[parts.scheme.lower()]
    addresses = resolve(host, port)
    for address in addresses:
        if not is_public_address(address) and not _is_allowed(host, address, allowed):
            raise UnsafeDestinationError(
                f"webhook_url: host {host!r} resolves to non-public address {address}; "
                f"allow it with allow_hosts or {ALLOW_HOSTS_ENV}"
            )
    return tuple(dict.fromkeys(addresses))  # unique, in resolver order


def resolve(host: str, port: int) -> list[IPAddress]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    # Strip an IPv6 zone ("fe80::1%eth0") before parsing.
    return [ipaddress.ip_address(info[4][0].split("%", 1)[0]) for info in infos]


def _is_allowed(host: str, address: IPAddress | None, allow_hosts: Collection[str]) -> bool:
    for entry in allow_hosts:
        entry = entry.strip().strip("[]").lower()
        if entry == host.lower():
            return True
        if address is None:
            continue
        try:
            if address in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue  # a host name, not an address or network
    return False
