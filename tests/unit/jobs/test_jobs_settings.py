"""Settings: everything under one data directory unless URLs are given."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.settings import Settings


def test_barge_data_dir_wins(tmp_path):
    settings = Settings.from_env({"BARGE_DATA_DIR": str(tmp_path / "d"), "XDG_DATA_HOME": "/xdg"})
    assert settings.data_dir == tmp_path / "d"
    assert settings.database_url == f"sqlite:///{tmp_path / 'd' / 'barge.db'}"
    assert settings.broker_url == "filesystem://"
    assert settings.is_embedded_broker
    assert settings.broker_dir == tmp_path / "d" / "broker"


def test_xdg_data_home_is_next():
    settings = Settings.from_env({"XDG_DATA_HOME": "/xdg/data"})
    assert settings.data_dir == Path("/xdg/data/barge")
    assert settings.database_url == "sqlite:////xdg/data/barge/barge.db"


def test_home_is_the_last_resort(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    settings = Settings.from_env({})
    assert settings.data_dir == tmp_path / ".local" / "share" / "barge"


@pytest.mark.parametrize("env", [{"BARGE_DATA_DIR": ""}, {"BARGE_DATA_DIR": "", "XDG_DATA_HOME": ""}])
def test_empty_variables_count_as_unset(tmp_path, monkeypatch, env):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert Settings.from_env(env).data_dir == tmp_path / ".local" / "share" / "barge"


def test_data_dir_expands_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert Settings.from_env({"BARGE_DATA_DIR": "~/barge-data"}).data_dir == tmp_path / "barge-data"


@pytest.mark.parametrize("given, expected", [
    ("postgresql://u:p@db:5432/barge", "postgresql+psycopg://u:p@db:5432/barge"),
    ("postgresql+psycopg://u@db/barge", "postgresql+psycopg://u@db/barge"),
    ("sqlite:////var/lib/barge.db", "sqlite:////var/lib/barge.db"),
])
def test_database_url(given, expected):
    assert Settings.from_env({"BARGE_DATABASE_URL": given, "BARGE_DATA_DIR": "/d"}).database_url == expected


def test_a_real_broker():
    settings = Settings.from_env({"BARGE_BROKER_URL": "amqp://guest@mq:5672//", "BARGE_DATA_DIR": "/d"})
    assert settings.broker_url == "amqp://guest@mq:5672//"
    assert not settings.is_embedded_broker


def test_the_process_environment_is_the_default(tmp_path, monkeypatch):
    monkeypatch.setenv("BARGE_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("BARGE_DATABASE_URL", raising=False)
    monkeypatch.delenv("BARGE_BROKER_URL", raising=False)
    assert Settings.from_env() == Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path}/barge.db",
                                           broker_url="filesystem://")


def test_worker_rows_are_kept_a_week_unless_told_otherwise():
    assert Settings.from_env({}).worker_retention_s == 7 * 86_400.0
    assert Settings.from_env({"BARGE_WORKER_RETENTION_S": "3600"}).worker_retention_s == 3600.0


@pytest.mark.parametrize("value", ["0", "-5", "seven days", "nan"])
def test_a_worker_retention_that_would_prune_live_workers_is_refused(value):
    with pytest.raises(ValueError, match="BARGE_WORKER_RETENTION_S"):
        Settings.from_env({"BARGE_WORKER_RETENTION_S": value})
