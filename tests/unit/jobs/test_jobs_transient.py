"""Which errors pass (retried, left to the job's owner) and which fail a job, and the
failpoints that the crash tests inject them with."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from kombu.exceptions import OperationalError as BrokerOperationalError
from sqlalchemy import exc as sa_exc

from jobs import failpoints
from jobs.transient import is_transient, retrying
from storage.errors import InputError, OutputError


def wrapped(driver_error: Exception) -> sa_exc.OperationalError:
    return sa_exc.OperationalError("SELECT 1", None, driver_error)


def storage_error(cause: Exception, kind=OutputError) -> Exception:
    try:
        raise kind("s3://bucket/out: cannot write part-00000") from cause
    except kind as error:
        return error


def s3_error(status: int, code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")


@pytest.mark.parametrize("error, passes", [
    (wrapped(psycopg.OperationalError("connection refused")), True),
    (wrapped(sqlite3.OperationalError("database is locked")), True),
    (wrapped(sqlite3.OperationalError("no such table: barge_jobs")), False),
    (sa_exc.IntegrityError("INSERT", None, Exception("duplicate key")), False),
    (ConnectionResetError(104, "reset by peer"), True),
    (TimeoutError("timed out"), True),
    (BrokerOperationalError("[Errno 111] Connection refused"), True),
    (storage_error(s3_error(503, "SlowDown")), True),
    (storage_error(s3_error(500, "InternalError")), True),
    (storage_error(s3_error(403, "AccessDenied")), False),
    (storage_error(EndpointConnectionError(endpoint_url="http://127.0.0.1:9")), True),
    (storage_error(ValueError("not a Parquet file"), InputError), False),
    (InputError("s3://bucket/in: column 'text' is not in the file"), False),
    (KeyError("no job 'x'"), False),
])
def test_is_transient(error, passes):
    assert is_transient(error) is passes


def test_retrying_waits_out_a_transient_error():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise wrapped(sqlite3.OperationalError("database is locked"))
        return "done"

    assert retrying("step", flaky, within_s=5, first_delay_s=0.01) == "done"
    assert len(calls) == 3


def test_retrying_raises_an_error_that_does_not_pass_at_once():
    calls = []

    def broken():
        calls.append(1)
        raise ValueError("schema wrong")

    with pytest.raises(ValueError):
        retrying("step", broken, within_s=5, first_delay_s=0.01)
    assert len(calls) == 1


def test_retrying_gives_up_after_its_window():
    def down():
        raise ConnectionRefusedError(111, "refused")

    with pytest.raises(ConnectionRefusedError):
        retrying("step", down, within_s=0.05, first_delay_s=0.01)


def test_a_failpoint_does_nothing_unless_named(monkeypatch):
    monkeypatch.setenv("BARGE_FAILPOINTS", "before_plan_commit=kill")
    failpoints.failpoint("after_begin_finalize")   # another point: passes


def test_an_unknown_failpoint_or_action_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="unknown failpoint"):
        failpoints.failpoint("after_lunch")
    monkeypatch.setenv("BARGE_FAILPOINTS", "after_begin_finalize=explode")
    with pytest.raises(ValueError, match="actions are"):
        failpoints.failpoint("after_begin_finalize")


@pytest.mark.parametrize("database_url, driver", [("postgresql://postgres@127.0.0.1/x", psycopg.OperationalError),
                                                  ("", sqlite3.OperationalError)])
def test_db_error_raises_the_drivers_error_for_its_window(monkeypatch, database_url, driver):
    monkeypatch.setenv("BARGE_DATABASE_URL", database_url)
    monkeypatch.setenv("BARGE_FAILPOINTS", "after_begin_finalize=db_error:0.3")
    monkeypatch.setattr(failpoints, "_first_pass", {})
    with pytest.raises(sa_exc.OperationalError) as raised:
        failpoints.failpoint("after_begin_finalize")
    assert isinstance(raised.value.orig, driver)
    assert is_transient(raised.value)
    import time
    time.sleep(0.35)
    failpoints.failpoint("after_begin_finalize")   # the window is over: passes
