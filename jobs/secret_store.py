"""The webhook-secret half of `jobs.store.Store` (which supplies `engine`, `secrets` and
`_job_transaction`): a job's secrets are stored encrypted (jobs.secret_box) and decrypted
only to sign a delivery; nothing here returns or logs a secret for display."""

from __future__ import annotations

import time

from sqlalchemy import Engine, select, update

from jobs import tables
from jobs.secret_box import SecretBox

# (table, key column, secret columns): every place a webhook secret is stored.
SECRET_COLUMNS = ((tables.jobs, "id", ("webhook_secret", "webhook_secret_previous")),
                  (tables.schedules, "id", ("webhook_secret",)))
REENCRYPT_BATCH = 500   # rows rewritten per transaction


class SecretStore:
    engine: Engine
    secrets: SecretBox

    def webhook_secrets(self, job_id: str, now: float | None = None) -> list[str]:
        """The secrets a delivery is signed with: the current one, and during a rotation
        the previous one too (receivers still holding it keep verifying). SecretKeyError
        if the key cannot decrypt them: better no delivery than an unsigned one."""
        now = time.time() if now is None else now
        job = tables.jobs.c
        with self.engine.connect() as conn:
            current, previous, until = conn.execute(select(
                job.webhook_secret, job.webhook_secret_previous, job.webhook_secret_previous_until)
                .where(job.id == job_id)).one()
        stored = [current, previous if until and until > now else None]
        return [self.secrets.decrypt(secret) for secret in stored if secret]

    def rotate_webhook_secret(self, job_id: str, new_secret: str, overlap_s: float) -> None:
        """Make `new_secret` current; the old one signs too for `overlap_s` more seconds."""
        now = time.time()
        with self._job_transaction(job_id) as (conn, job):
            if not job.webhook_secret:
                raise ValueError(f"job {job_id} has no webhook")
            conn.execute(update(tables.jobs).where(tables.jobs.c.id == job_id).values(
                webhook_secret=self.secrets.encrypt(new_secret), webhook_secret_previous=job.webhook_secret,
                webhook_secret_previous_until=now + overlap_s, updated_at=now))

    def reencrypt_secrets(self) -> int:
        """Encrypt every stored webhook secret under the first key (`barge secrets
        rotate-key`); how many values were rewritten. Each is compared-and-set, so a
        secret rotated meanwhile is left as its rotation wrote it."""
        num_rewritten = 0
        for table, key_name, column_names in SECRET_COLUMNS:
            for column_name in column_names:
                key, column = table.c[key_name], table.c[column_name]
                with self.engine.connect() as conn:
                    rows = conn.execute(select(key, column).where(column.is_not(None))).all()
                for start in range(0, len(rows), REENCRYPT_BATCH):
                    with self.engine.begin() as conn:
                        for row_key, stored in rows[start:start + REENCRYPT_BATCH]:
                            rewrite = update(table).where(key == row_key, column == stored)
                            num_rewritten += conn.execute(
                                rewrite.values({column_name: self.secrets.reencrypt(stored)})).rowcount
        return num_rewritten
