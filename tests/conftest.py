"""Test-wide settings: no model hub (weights come from installed packages), and no
test touches the user's real Barge data directory."""

import os
import sys
import tempfile

import pytest
import torch
from cryptography.fernet import Fernet

from tests.support import service_guard, xdist_groups

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
    if os.environ.get(service_guard.ENV) == "1":
        service_guard.install()
    xdist_groups.start(config)


def pytest_unconfigure(config):
    xdist_groups.finish(config)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    xdist_groups.configure_node(node)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadgroup that groups under pytest 9.2 (tests/support/xdist_groups.py)."""
    return xdist_groups.make_scheduler(config, log)


@pytest.hookimpl(tryfirst=True)   # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    """A test that takes a PostgreSQL database from the `postgres_url` fixture needs the
    server: marked `postgres` here (make test runs those apart from the `serial` tests,
    which stop it), whichever module it is in.

    make test spreads tests over its processes with `--dist loadgroup`: a test goes to
    whichever process is free, but the tests of one `xdist_group` all go to one process
    (tests/support/xdist_groups.py).
    A test that uses a fixture set up once per module or class (a model loaded, a reference
    computed, a deployment started) is put in its module's group here, so that the setup
    runs once, not once in each process that happens to take one of them (seen with
    --dist worksteal: the Whisper parity module's reference decode computed in three
    processes). A test that names its group itself keeps it."""
    for item in items:
        if "postgres_url" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("postgres"):
            item.add_marker(pytest.mark.postgres)
        if not item.get_closest_marker("xdist_group") and _shares_a_module_setup(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    xdist_groups.write_groups(config, items)


def _shares_a_module_setup(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    module = item.nodeid.split("::")[0]
    return any(fixturedef.baseid and (fixturedef.scope in ("class", "module", "package")   # not a plugin's
                                      or (fixturedef.scope == "session" and fixturedef.baseid == module))
               for fixturedefs in info.name2fixturedefs.values() for fixturedef in fixturedefs)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under BARGE_TEST_WITHOUT_SERVICES=1 (make test runs the tests marked neither
    postgres, rabbitmq nor redis so, beside the `serial` ones that stop those services), a
    test that reached for one of them fails, naming the marker it lacks, even where its
    code took the refused connection for an outage and skipped or went on."""
    outcome = yield
    report = outcome.get_result()
    reached = service_guard.take_reached()
    if reached:
        original = f"\n\n{report.longreprtext}" if report.longrepr else ""
        report.outcome = "failed"
        marked = {mark.name for mark in item.iter_markers()}
        report.longrepr = service_guard.message(item.nodeid, reached, marked) + original


def pytest_runtest_logreport(report):
    """With BARGE_TEST_DURATIONS=FILE, each test's phases of a second or more append
    "seconds phase nodeid" to FILE as they end: the slow tests, seen while a run goes on."""
    if _DURATIONS["path"] and report.duration >= 1.0:
        with open(_DURATIONS["path"], "a") as log:
            log.write(f"{report.duration:8.1f} {report.when:8} {report.nodeid}\n")
