"""API keys for `barge serve`: created by `barge api-key create`, kept only as a SHA-256.

A key is 32 random bytes (`sk-barge-` + URL-safe base64), so a plain SHA-256 is enough
to keep it: there is nothing to guess that a slow hash would protect (as GitHub's and
OpenAI's tokens are kept). The secret is shown once, at creation; a lookup hashes the
presented token and compares in SQL, and a revoked key no longer authenticates.
"""

from __future__ import annotations

import hashlib
import secrets
import time
import uuid
from dataclasses import dataclass

from sqlalchemy import Engine, insert, select, update

from jobs.api_tables import api_keys

SECRET_PREFIX = "sk-barge-"


@dataclass(frozen=True)
class ApiKey:
    id: str                    # "key_..."; owns files and batches
    name: str
    created_at: float
    revoked_at: float | None = None
    is_operator: bool = False  # sees every key's jobs on the dashboard (`barge api-key create --operator`)


@dataclass(frozen=True)
class CreatedKey:
    key: ApiKey
    secret: str                # the bearer token: shown once, never stored


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class ApiKeys:
    def __init__(self, engine: Engine):
        self.engine = engine

    def create(self, name: str, *, operator: bool = False) -> CreatedKey:
        if not name or not name.strip() or len(name) > 200:
            raise ValueError(f"api key name must be 1 to 200 characters, got {name!r}")
        key = ApiKey(id=f"key_{uuid.uuid4().hex[:16]}", name=name.strip(), created_at=time.time(),
                     is_operator=operator)
        secret = SECRET_PREFIX + secrets.token_urlsafe(32)
        with self.engine.begin() as conn:
            conn.execute(insert(api_keys).values(id=key.id, name=key.name, secret_sha256=hash_secret(secret),
                                                 created_at=key.created_at, is_operator=operator))
        return CreatedKey(key, secret)

    def authenticate(self, secret: str) -> ApiKey | None:
        """The live key whose secret this is, or None."""
        if not secret.startswith(SECRET_PREFIX) or len(secret) > 200:
            return None
        with self.engine.connect() as conn:
            row = conn.execute(select(api_keys).where(api_keys.c.secret_sha256 == hash_secret(secret),
                                                      api_keys.c.revoked_at.is_(None))).one_or_none()
        return None if row is None else _key(row)

    def list(self) -> list[ApiKey]:
        with self.engine.connect() as conn:
            return [_key(row) for row in conn.execute(select(api_keys).order_by(api_keys.c.created_at))]

    def revoke(self, key_id: str) -> bool:
        """False if there is no such live key."""
        with self.engine.begin() as conn:
            result = conn.execute(update(api_keys).where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
                                  .values(revoked_at=time.time()))
        return result.rowcount == 1


def _key(row) -> ApiKey:
    return ApiKey(id=row.id, name=row.name, created_at=row.created_at, revoked_at=row.revoked_at,
                  is_operator=bool(row.is_operator))
