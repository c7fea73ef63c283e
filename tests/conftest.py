"""Test-wide settings: no model hub (weights come from installed packages), and no
test touches the user's real Barge data directory."""

import os
import sys
import tempfile

import pytest
import torch
from cryptography.fernet import Fernet

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ["BARGE_DATA_DIR"] = tempfile.mkdtemp(prefix="barge-tests-")
# Stores other than SQLite open only with a key for the webhook secrets (jobs.secret_box);
# one key for the whole run, so every process a test starts reads what the others wrote.
os.environ.setdefault("BARGE_SECRET_KEY", Fernet.generate_key().decode())
# Every process a test starts runs on this one machine, PostgreSQL and RabbitMQ included:
# one host (jobs.hosts), so local paths serve. Tests of many hosts set BARGE_SINGLE_HOST=0.
os.environ.setdefault("BARGE_SINGLE_HOST", "1")
# Without a GPU the Triton kernels run in Triton's interpreter. It must be on before
# triton is first imported (triton.language's own helpers are jit'd at import), hence here.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_sessionstart(session):
    """Build the CPU decode-attention kernel once, before any test, so that no worker
    process a test starts spends its job's time compiling it (it is cached per machine)."""
    from engine.kernels import cpu_ops

    cpu_ops.cpu_kernels_available()


@pytest.fixture(autouse=True)
def _no_s3_client_outlives_its_test():
    """fsspec keeps one S3FileSystem per set of constructor arguments for the life of the
    process, and a default one takes its endpoint from AWS_ENDPOINT_URL when it is made:
    one made while a test pointed that at its own moto server would serve the next test,
    whose server listens elsewhere ("Could not connect to the endpoint URL")."""
    yield
    s3fs = sys.modules.get("s3fs")
    if s3fs is not None:
        s3fs.S3FileSystem.clear_instance_cache()


_DURATIONS = {"path": None}


def pytest_configure(config):
    # the xdist controller (or a plain run) writes the log; an xdist worker's reports reach it
    if not hasattr(config, "workerinput"):
        _DURATIONS["path"] = os.environ.get("BARGE_TEST_DURATIONS")
    else:
        # make test's parallel run: several test processes share the cores, so each
        # computes its references on one thread rather than spin against the others
        torch.set_num_threads(1)


def pytest_runtest_logreport(report):
    """With BARGE_TEST_DURATIONS=FILE, each test's phases of a second or more append
    "seconds phase nodeid" to FILE as they end: the slow tests, seen while a run goes on."""
    if _DURATIONS["path"] and report.duration >= 1.0:
        with open(_DURATIONS["path"], "a") as log:
            log.write(f"{report.duration:8.1f} {report.when:8} {report.nodeid}\n")
