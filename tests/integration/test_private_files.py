"""Barge's state on disk is its owner's alone (jobs.private_files), on a real SQLite
store: a fresh one is 0600 files (database, -wal, -shm, secret.key) in a 0700 folder
under the usual umask 022, and an older one left readable by others is tightened."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
from sqlalchemy import text

from jobs.client import Client
from jobs.settings import Settings
from jobs.store import Store


@pytest.fixture(autouse=True)
def usual_umask():
    """Group and world may read what is created, unless Barge says otherwise."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def open_store(database: Path) -> Store:
    """A migrated store holding a connection open, so SQLite's -wal and -shm exist."""
    store = Store(f"sqlite:///{database}")
    store.migrate()
    return store


def test_a_fresh_store_is_private(tmp_path, monkeypatch):
    monkeypatch.delenv("BARGE_SECRET_KEY")   # the key file beside the database is made first, with its folder
    folder = tmp_path / "data" / "state"
    store = open_store(folder / "barge.db")
    with store.engine.connect() as conn:
        conn.execute(text("SELECT 1"))
        names = {path.name: mode(path) for path in folder.iterdir()}
    store.engine.dispose()
    assert names == {"barge.db": 0o600, "barge.db-wal": 0o600, "barge.db-shm": 0o600, "secret.key": 0o600}
    assert mode(folder) == 0o700
    assert mode(folder.parent) == 0o755   # a parent Barge had to create follows the umask


def test_an_existing_store_readable_by_others_is_tightened(tmp_path, caplog):
    folder = tmp_path / "shared"
    open_store(folder / "barge.db").engine.dispose()
    os.chmod(folder / "barge.db", 0o644)
    os.chmod(folder, 0o755)
    with caplog.at_level(logging.WARNING, logger="barge.store"):
        store = open_store(folder / "barge.db")
    with store.engine.connect() as conn:
        conn.execute(text("SELECT 1"))
        assert {mode(folder / name) for name in ("barge.db", "barge.db-wal", "barge.db-shm")} == {0o600}
    store.engine.dispose()
    assert f"{folder / 'barge.db'} was mode 644, readable by others: now 600" in caplog.text
    assert mode(folder) == 0o755   # the folder of a database path is not Barge's to change (it may be /tmp)


def test_the_data_folder_is_tightened_by_the_client(tmp_path, caplog):
    data_dir = tmp_path / "barge-data"
    data_dir.mkdir(mode=0o755)
    settings = Settings.from_env({"BARGE_DATA_DIR": str(data_dir)})
    with caplog.at_level(logging.WARNING, logger="barge.store"):
        client = Client(settings=settings)
    client.store.engine.dispose()
    assert mode(data_dir) == 0o700 and mode(data_dir / "barge.db") == 0o600
    assert f"{data_dir} was mode 755, readable by others: now 700" in caplog.text
