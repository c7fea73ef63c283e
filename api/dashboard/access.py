"""Who is looking at the dashboard.

A browser cannot send `Authorization: Bearer` on a page load, so a key is given once on
the login page and kept in an HttpOnly, SameSite=Strict cookie scoped to /dashboard; an
API client may send the header instead. With a key, the viewer sees that key's jobs
(api.dashboard.reads). With no key, the viewer is the operator and sees everything,
only where the server allows it: bound to loopback (`barge serve` on 127.0.0.1, the
default) and asked from loopback. Anywhere else a key is required.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from fastapi import Request

from jobs.api_keys import ApiKey, ApiKeys

COOKIE = "barge_dashboard_key"
PREFIX = "/dashboard"


@dataclass(frozen=True)
class Viewer:
    key: ApiKey | None            # None: the operator, on loopback with no key

    @property
    def key_id(self) -> str | None:
        return None if self.key is None else self.key.id

    @property
    def label(self) -> str:
        return "operator (loopback, no key)" if self.key is None else f"key {self.key.name} ({self.key.id})"


class NeedsKey(Exception):
    """No usable key: the page answers with the login form, the JSON with 401."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def is_loopback(host: str | None) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


class Access:
    def __init__(self, keys: ApiKeys, keyless_on_loopback: bool):
        self.keys = keys
        self.keyless_on_loopback = keyless_on_loopback

    def viewer(self, request: Request) -> Viewer:
        token = presented_token(request)
        if token:
            key = self.keys.authenticate(token)
            if key is None:
                raise NeedsKey("that API key is not valid (unknown or revoked)")
            return Viewer(key)
        if self.keyless_on_loopback and is_loopback(request.client.host if request.client else None):
            return Viewer(None)
        raise NeedsKey("the dashboard needs an API key (`barge api-key create`)")


def presented_token(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.cookies.get(COOKIE) or None
