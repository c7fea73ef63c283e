"""Fixtures shared by the integration tests."""

import pytest

from jobs.store import Store


@pytest.fixture
def sqlite_store(tmp_path):
    """A migrated store on a fresh SQLite file."""
    store = Store(f"sqlite:///{tmp_path / 'barge.db'}")
    store.migrate()
    yield store
    store.engine.dispose()
