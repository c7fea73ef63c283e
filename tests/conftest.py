"""Test-wide settings: no model hub (weights come from installed packages), and no
test touches the user's real Barge data directory."""

import os
import tempfile

import torch
from cryptography.fernet import Fernet

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ["BARGE_DATA_DIR"] = tempfile.mkdtemp(prefix="barge-tests-")
# Stores other than SQLite open only with a key for the webhook secrets (jobs.secret_box);
# one key for the whole run, so every process a test starts reads what the others wrote.
os.environ.setdefault("BARGE_SECRET_KEY", Fernet.generate_key().decode())
# Without a GPU the Triton kernels run in Triton's interpreter. It must be on before
# triton is first imported (triton.language's own helpers are jit'd at import), hence here.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_sessionstart(session):
    """Build the CPU decode-attention kernel once, before any test, so that no worker
    process a test starts spends its job's time compiling it (it is cached per machine)."""
    from engine.kernels import cpu_ops

    cpu_ops.cpu_kernels_available()
