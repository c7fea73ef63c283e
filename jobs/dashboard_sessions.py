"""Dashboard sessions of `barge serve`, kept on the server.

The dashboard's cookie holds a random session id, never an API key: only the id's
SHA-256 is stored (as keys are, jobs.api_keys), so a copy of the database opens nothing.
A session ends when it expires, at logout (`end`), or when its key is revoked; a copied
cookie then opens nothing either. A session made by the one-time login URL that
`barge serve` prints belongs to no key and is the operator's.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from sqlalchemy import Engine, delete, insert, select, update

from jobs.api_keys import ApiKey, hash_secret
from jobs.api_tables import api_keys, dashboard_sessions

SESSION_TTL_S = 12 * 3600.0      # a working day; then the login form again
EXPIRED_KEPT_S = 7 * 86_400.0    # ended sessions are deleted this long after their expiry


@dataclass(frozen=True)
class Session:
    key: ApiKey | None           # None: the operator, logged in by the login URL
    is_operator: bool


class DashboardSessions:
    def __init__(self, engine: Engine, ttl_s: float = SESSION_TTL_S):
        self.engine = engine
        self.ttl_s = ttl_s

    def start(self, key: ApiKey | None) -> str:
        """A new session for `key` (None: the operator); returns the id for the cookie."""
        session_id = secrets.token_urlsafe(32)
        now = time.time()
        with self.engine.begin() as conn:
            conn.execute(delete(dashboard_sessions).where(dashboard_sessions.c.expires_at < now - EXPIRED_KEPT_S))
            conn.execute(insert(dashboard_sessions).values(
                id_sha256=hash_secret(session_id), key_id=None if key is None else key.id,
                is_operator=key is None or key.is_operator, created_at=now, expires_at=now + self.ttl_s))
        return session_id

    def find(self, session_id: str) -> Session | None:
        """The live session with this id: not expired, not ended, its key not revoked."""
        if not session_id or len(session_id) > 200:
            return None
        s, k = dashboard_sessions.c, api_keys.c
        query = (select(s.key_id, k.name, k.created_at, k.revoked_at, k.is_operator)
                 .select_from(dashboard_sessions.outerjoin(api_keys))
                 .where(s.id_sha256 == hash_secret(session_id), s.revoked_at.is_(None), s.expires_at > time.time()))
        with self.engine.connect() as conn:
            row = conn.execute(query).one_or_none()
        if row is None:
            return None
        if row.key_id is None:
            return Session(None, True)
        if row.revoked_at is not None:
            return None
        key = ApiKey(id=row.key_id, name=row.name, created_at=row.created_at, is_operator=bool(row.is_operator))
        return Session(key, key.is_operator)

    def end(self, session_id: str) -> bool:
        with self.engine.begin() as conn:
            result = conn.execute(update(dashboard_sessions).where(dashboard_sessions.c.id_sha256 == hash_secret(session_id),
                                                                   dashboard_sessions.c.revoked_at.is_(None))
                                  .values(revoked_at=time.time()))
        return result.rowcount == 1
