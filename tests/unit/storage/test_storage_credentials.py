"""Credentials in storage_options or the environment never reach an error message."""

from __future__ import annotations

import pyarrow as pa
import pytest

from storage import InputError, OutputError, check_writable, describe, inspect_input, write_part

KEY, SECRET, TOKEN = "AKIAEXAMPLEKEY0001", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYSECRET", "FwoGZXIvYXdzSESSIONTOKEN"


def leaky_options() -> dict:
    """Credentials everywhere s3fs takes them, and an endpoint (nothing listens there) quoting them too."""
    return {"key": KEY, "secret": SECRET, "token": TOKEN,
            "client_kwargs": {"endpoint_url": f"http://{KEY}:{SECRET}@127.0.0.1:9", "region_name": "us-east-1",
                              "aws_session_token": TOKEN},
            "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1}}


def assert_no_credentials(text: str) -> None:
    for secret in (KEY, SECRET, TOKEN):
        assert secret not in text


def test_describe_scrubs_option_values_userinfo_and_environment(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret-value")
    error = OSError(f"could not reach http://{KEY}:{SECRET}@host/b with token {TOKEN} and env-secret-value")
    text = describe(error, leaky_options())
    assert_no_credentials(text)
    assert "env-secret-value" not in text
    assert text == "OSError: could not reach http://***@host/*** with token *** and ***"   # a web path is masked too


@pytest.mark.parametrize("call", [
    lambda options: inspect_input("s3://bucket/in/*.parquet", columns={"input_column": "text"},
                                  storage_options=options),
    lambda options: inspect_input("s3://bucket/in/a.parquet", columns={"input_column": "text"},
                                  storage_options=options),
], ids=["glob", "one file"])
def test_input_errors_over_s3_hold_no_credentials(call):
    with pytest.raises(InputError) as caught:
        call(leaky_options())
    assert "s3://bucket/in/" in str(caught.value)
    assert_no_credentials(str(caught.value))


@pytest.mark.parametrize("call", [
    lambda options: check_writable("s3://bucket/out", storage_options=options),
    lambda options: write_part("s3://bucket/out", "part-00000-00000.parquet", pa.table({"a": [1]}),
                               storage_options=options),
], ids=["check_writable", "write_part"])
def test_output_errors_over_s3_hold_no_credentials(call):
    with pytest.raises(OutputError) as caught:
        call(leaky_options())
    assert "s3://bucket/out" in str(caught.value)
    assert_no_credentials(str(caught.value))


def test_local_errors_with_credential_options_hold_none(tmp_path):
    with pytest.raises(InputError) as caught:
        inspect_input(str(tmp_path / "missing.parquet"), columns={"input_column": "text"},
                      storage_options={"secret": SECRET})
    assert_no_credentials(str(caught.value))
