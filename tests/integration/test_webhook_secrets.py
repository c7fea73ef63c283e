"""Webhook secrets at rest (jobs.secret_box) on real SQLite and PostgreSQL, delivered to a
real HTTP receiver on 127.0.0.1.

Given a store opened with a key, when a job or schedule stores its webhook secret, then
the database holds only ciphertext, and deliveries are still signed with the secret.
Given no key, a PostgreSQL store does not open (nor does a worker on it), while the
embedded SQLite store makes its own key file. Given the wrong key, nothing is sent.
Given `barge secrets rotate-key`, every secret moves to the new key; given an older
database with secrets in plain text, migrating encrypts them.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from cli.main import main as barge
from jobs.events import final_event
from cli.secret import rotate_key
from jobs.secret_box import KEY_ENV, SecretBox, SecretKeyError, generate_key
from jobs.status import JobStatus
from jobs.store import MIGRATIONS, Store
from queueing.dispatch import deliver_event
from tests.integration.test_store import make_spec, postgres_url, store_url  # noqa: F401 (fixtures)
from tests.support.receiver import WebhookReceiver
from webhooks.retry import RetryPolicy
from webhooks.signing import generate_secret, verify

LOCAL = ("127.0.0.1",)
REPO = Path(__file__).resolve().parents[2]
# The revision before webhook secrets were encrypted.
BEFORE_ENCRYPTION = ScriptDirectory(str(MIGRATIONS)).get_revision("0011").down_revision
TEMPLATE = {"mode": "embed", "model": "minilm", "input": "/in/", "output": "/out/", "webhook_url": "https://x/"}


def open_store(url: str, *keys: str) -> Store:
    store = Store(url, SecretBox(list(keys)))
    store.migrate()
    return store


def stored_secrets(store: Store) -> list[str]:
    """Every webhook secret value as the database holds it."""
    with store.engine.connect() as conn:
        jobs = conn.execute(sa.text("SELECT webhook_secret, webhook_secret_previous FROM barge_jobs")).all()
        schedules = conn.execute(sa.text("SELECT webhook_secret FROM barge_schedules")).scalars().all()
    return [value for row in jobs for value in row if value] + [value for value in schedules if value]


def failed_job_event(store: Store, url: str, secret: str) -> str:
    job_id = store.create_job(make_spec(webhook_url=url), model_key="m", rows_total=1, output_schema="s",
                              webhook_secret=secret)
    event = final_event(store, job_id, JobStatus.FAILED, "boom")
    assert store.finish_job(job_id, JobStatus.FAILED, error="boom", event=event)
    return event.id


def test_secrets_are_stored_encrypted_and_still_sign(store_url):
    store = open_store(store_url, generate_key())
    secret, schedule_secret = generate_secret(), generate_secret()
    with WebhookReceiver() as receiver:
        event_id = failed_job_event(store, receiver.url, secret)
        schedule = store.add_schedule("nightly", "0 2 * * *", "UTC", TEMPLATE, "skip", None,
                                      webhook_secret=schedule_secret)
        stored = stored_secrets(store)
        assert len(stored) == 2 and all(value.startswith("fernet:") for value in stored)
        assert not any(s in value or s.removeprefix("whsec_") in value for value in stored
                       for s in (secret, schedule_secret))
        assert store.schedule_webhook_secret(schedule.id) == schedule_secret
        assert deliver_event(store, event_id, RetryPolicy(), allow_hosts=LOCAL)
        assert verify(secret, *receiver.wait_for(1)[0])["type"] == "job.failed"
    store.engine.dispose()


def test_a_postgresql_store_without_the_key_does_not_open(postgres_url, monkeypatch, capsys):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(SecretKeyError, match=f"{KEY_ENV} is not set"):
        Store(postgres_url)
    monkeypatch.setenv("BARGE_DATABASE_URL", postgres_url)
    assert barge(["jobs"]) == 1
    assert f"{KEY_ENV} is not set" in capsys.readouterr().err


def test_a_worker_on_postgresql_without_the_key_exits_before_serving(postgres_url, tmp_path):
    env = {key: value for key, value in os.environ.items() if key != KEY_ENV}
    env.update(BARGE_DATABASE_URL=postgres_url, BARGE_DATA_DIR=str(tmp_path), PYTHONPATH=str(REPO))
    worker = subprocess.run([sys.executable, "-m", "cli", "worker", "--model", "minilm"], env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert worker.returncode == 1
    assert f"{KEY_ENV} is not set" in worker.stderr and " ready." not in worker.stdout + worker.stderr


def test_the_embedded_store_makes_its_own_key_file(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    url = f"sqlite:///{tmp_path / 'data' / 'barge.db'}"
    first = Store(url)
    first.migrate()
    key_file = tmp_path / "data" / "secret.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    secret = generate_secret()
    job_id = first.create_job(make_spec(), model_key="m", rows_total=1, output_schema="s", webhook_secret=secret)
    assert stored_secrets(first)[0].startswith("fernet:")
    again = Store(url)   # another process: the same key, read from the file
    assert again.webhook_secrets(job_id) == [secret]
    first.engine.dispose()
    again.engine.dispose()


def test_the_wrong_key_sends_nothing_and_says_why(store_url):
    right, wrong = generate_key(), generate_key()
    with WebhookReceiver() as receiver:
        event_id = failed_job_event(open_store(store_url, right), receiver.url, generate_secret())
        store = open_store(store_url, wrong)
        assert deliver_event(store, event_id, RetryPolicy(), allow_hosts=LOCAL) is False
        assert receiver.requests == []
        [attempt] = store.outbox.attempts(event_id)
        assert attempt.error.startswith("not sent: a stored webhook secret cannot be decrypted")
        assert store.outbox.event(event_id).status == "pending"   # retried once the key is right
    store.engine.dispose()


def test_rotate_key_moves_every_secret_to_the_new_key(store_url, monkeypatch, capsys):
    old, new = generate_key(), generate_key()
    secret, previous = generate_secret(), generate_secret()
    store = open_store(store_url, old)
    job_id = store.create_job(make_spec(), model_key="m", rows_total=1, output_schema="s", webhook_secret=previous)
    store.rotate_webhook_secret(job_id, secret, overlap_s=3600)
    schedule = store.add_schedule("nightly", "0 2 * * *", "UTC", TEMPLATE, "skip", None, webhook_secret=previous)
    # Given every process on "NEW,OLD", when rotate-key runs,
    monkeypatch.setenv(KEY_ENV, f"{new},{old}")
    monkeypatch.setenv("BARGE_DATABASE_URL", store_url)
    assert barge(["secrets", "rotate-key"]) == 0
    assert "re-encrypted 3 stored webhook secret(s)" in capsys.readouterr().out
    # then the new key alone reads every secret, and the old one none.
    after = open_store(store_url, new)
    assert after.webhook_secrets(job_id) == [secret, previous]
    assert after.schedule_webhook_secret(schedule.id) == previous
    with pytest.raises(SecretKeyError):
        open_store(store_url, old).webhook_secrets(job_id)
    store.engine.dispose()
    after.engine.dispose()


def test_rotate_key_of_the_embedded_key_file(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(KEY_ENV, raising=False)
    url = f"sqlite:///{tmp_path / 'barge.db'}"
    store = Store(url)
    store.migrate()
    secret = generate_secret()
    job_id = store.create_job(make_spec(), model_key="m", rows_total=1, output_schema="s", webhook_secret=secret)
    old = (tmp_path / "secret.key").read_text().split()
    assert rotate_key(url) == 0
    assert "re-encrypted 1 stored webhook secret(s)" in capsys.readouterr().out
    keys = (tmp_path / "secret.key").read_text().split()
    assert len(keys) == 2 and keys[1] == old[0] and keys[0] != old[0]
    assert open_store(url, keys[0]).webhook_secrets(job_id) == [secret]   # the new key alone
    assert store.webhook_secrets(job_id) == [secret], "a process holding the old key reads the file again"
    store.engine.dispose()


def test_migrating_an_older_database_encrypts_its_plain_secrets(store_url):
    secret, previous, schedule_secret = generate_secret(), generate_secret(), generate_secret()
    key = generate_key()
    old = Store(store_url, SecretBox([key]))
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with old.engine.begin() as conn:   # a database as the revision before encryption left it
        config.attributes["connection"] = conn
        command.upgrade(config, BEFORE_ENCRYPTION)
        conn.execute(sa.text(
            "INSERT INTO barge_jobs (id, status, mode, model_key, spec, rows_total, output_schema, created_at, "
            "updated_at, webhook_secret, webhook_secret_previous, webhook_secret_previous_until) "
            "VALUES ('j', :failed, 'embed', 'm', '{}', 1, 's', 0, 0, :current, :previous, 1e12)"),
            dict(failed=int(JobStatus.FAILED), current=secret, previous=previous))
        conn.execute(sa.text(
            "INSERT INTO barge_schedules (id, name, cron, timezone, template, is_enabled, catchup, webhook_secret, "
            "next_run_at, created_at, updated_at) VALUES ('s', 'n', '0 2 * * *', 'UTC', '{}', true, 'skip', "
            ":secret, 0, 0, 0)"), dict(secret=schedule_secret))
    assert old.webhook_secrets("j") == [secret, previous], "plain text still reads before migrating"
    old.migrate()
    stored = stored_secrets(old)
    assert len(stored) == 3 and all(value.startswith("fernet:") for value in stored)
    assert old.webhook_secrets("j") == [secret, previous]
    assert old.schedule_webhook_secret("s") == schedule_secret
    old.engine.dispose()
