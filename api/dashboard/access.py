"""Who is looking at the dashboard.

A browser cannot send `Authorization: Bearer` on a page load, so a key is given once on
the login form and the browser keeps a session id (jobs.dashboard_sessions) in an
HttpOnly, SameSite=Strict cookie scoped to /dashboard, never the key itself; an API
client may send the header instead. api.auth's gate has already found the credential on
the headers (`scope["state"]["principal"]`). A key sees its own jobs
(api.dashboard.reads); an operator key, or a session opened with the one-time login URL
that `barge serve` prints, sees everything. Nobody is let in by address.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from api.auth import Principal
from jobs.api_keys import ApiKey

PREFIX = "/dashboard"


@dataclass(frozen=True)
class Viewer:
    key: ApiKey | None            # None: the operator, by the login URL
    is_operator: bool
    session_id: str | None = None

    @property
    def key_id(self) -> str | None:
        """The key whose jobs are shown; None: every key's (the operator)."""
        return None if self.is_operator or self.key is None else self.key.id

    @property
    def label(self) -> str:
        if self.key is None:
            return "operator (login URL)"
        return f"{'operator key' if self.is_operator else 'key'} {self.key.name} ({self.key.id})"


class NeedsKey(Exception):
    """No usable credential: the page answers with the login form, the JSON with 401."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def viewer(request: Request) -> Viewer:
    principal: Principal | None = getattr(request.state, "principal", None)
    if principal is None:
        problem = getattr(request.state, "credential_problem", None)
        raise NeedsKey(problem or "the dashboard needs an API key (`barge api-key create`) or the login URL "
                                  "`barge serve` printed")
    return Viewer(principal.key, principal.is_operator, principal.session_id)
