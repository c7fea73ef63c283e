"""The scoring params, outputs, config reading and pure decisions load no torch: the worker
and job validation build and check them without the model code (issue 42's light entry points)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
PROBE = """
import sys
from engine.score import ClassifyParams, ScoreParams, ClassifyResult, ScoreOutput, score_method, top_n
import engine.score.labels, engine.score.query_groups, engine.score.rerank_prompt, engine.score.rows
ClassifyParams(threshold=0.3); ScoreParams(instruction="Find boats")
print("LOADED", [name for name in ("torch", "transformers", "engine.score.classifier") if name in sys.modules])
"""


def test_params_outputs_and_decisions_import_no_torch():
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "LOADED []" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
