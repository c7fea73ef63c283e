"""A real S3 API server (moto's standalone server) on 127.0.0.1, for tests.

    with S3Server() as s3:
        storage_options = s3.storage_options   # for s3fs / storage.*
        s3.create_bucket("corpus")
        ...use s3://corpus/... ...

It runs as a separate process speaking HTTP, so the code under test goes
through s3fs, botocore and the network exactly as it would against AWS.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class S3Server:
    """Starts `python -m moto.server` on a free port; stops it on exit."""

    def __init__(self, start_timeout_s: float = 30.0) -> None:
        self.start_timeout_s = start_timeout_s
        self.port = _free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen | None = None
        self._log = None

    @property
    def storage_options(self) -> dict:
        return {"key": ACCESS_KEY, "secret": SECRET_KEY,
                "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": REGION}}

    def __enter__(self) -> S3Server:
        # The server logs every request: to a file, since a full pipe would stall it.
        self._log = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log, stderr=subprocess.STDOUT, env=_server_env(),
        )
        self._wait_until_ready()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None
        self._log.close()

    def create_bucket(self, name: str) -> None:
        # boto3, not s3fs: s3fs sends region_name as a LocationConstraint, which us-east-1 refuses.
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint_url, region_name=REGION,
                              aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
        client.create_bucket(Bucket=name)

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                returncode, log_tail = self._process.returncode, self._log_tail()
                self.stop()
                raise RuntimeError(f"moto server exited with {returncode}: {log_tail}")
            if self._answers():
                return
            time.sleep(0.1)
        log_tail = self._log_tail()
        self.stop()
        raise RuntimeError(f"moto server did not answer on {self.endpoint_url} "
                           f"within {self.start_timeout_s}s: {log_tail}")

    def _answers(self) -> bool:
        try:
            _NO_PROXY.open(self.endpoint_url, timeout=1).close()
        except urllib.error.HTTPError:
            return True  # any HTTP status means the server is up
        except OSError:
            return False
        return True

    def _log_tail(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-2000:]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _server_env() -> dict[str, str]:
    # The server must not pick up real credentials or a proxy from the test's environment.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and "proxy" not in k.lower()}
    env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_DEFAULT_REGION=REGION)
    return env
