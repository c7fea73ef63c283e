"""Test-wide settings: no model hub (weights come from installed packages), and no
test touches the user's real Barge data directory."""

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ["BARGE_DATA_DIR"] = tempfile.mkdtemp(prefix="barge-tests-")
