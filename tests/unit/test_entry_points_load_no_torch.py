"""The light entry points load no torch (issue 42): `barge --help`, `barge submit`
(checking a job, an OpenAI batch file included), the API server's app and `from jobs
import Client` import neither torch nor the engine's model code. engine/__init__ and
engine/generate/__init__ load their names on first use, so the torch-free constraint
module (engine.generate.structured) that api.batch_input needs comes alone. Each case
runs in a fresh interpreter: this test process has torch loaded already."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "engine.engine", "engine.generate.llm_engine")

PROBE = """
import sys
{code}
loaded = [name for name in {heavy!r} if name in sys.modules]
print("LOADED", loaded)
"""


def loaded_after(code: str, tmp_path: Path) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE.format(code=code, heavy=HEAVY)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "BARGE_DATA_DIR": str(tmp_path / "data")})
    line = next((line for line in done.stdout.splitlines() if line.startswith("LOADED")), None)
    assert line is not None, done.stdout[-2000:] + done.stderr[-2000:]
    return eval(line.removeprefix("LOADED "))   # a list literal printed by the probe


def test_the_client_the_api_server_and_the_cli_import_no_torch(tmp_path):
    assert loaded_after("import jobs; from jobs import Client; import api.app; import cli.main", tmp_path) == []


def test_barge_help_and_submit_dry_runs_load_no_torch(tmp_path):
    pq.write_table(pa.table({"text": ["a barge", "a river"]}), tmp_path / "corpus.parquet")
    batch = tmp_path / "batch.jsonl"
    batch.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                                 "body": {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}],
                                          "response_format": {"type": "json_object"}}}) + "\n")
    pq.write_table(pa.table({"q": ["a barge"], "d": ["a boat"]}), tmp_path / "pairs.parquet")
    runs = {
        "help": "from cli.main import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass",
        # a score job's checks: its params as ScoreParams, the model's scorer from config.json
        "score": f"from cli.main import main\nassert main(['submit', '--mode', 'score', '--model', 'minilm', '--input', "
                 f"'{tmp_path / 'pairs.parquet'}', '--output', '{tmp_path / 'out3'}', '--param', 'query_column=q', "
                 f"'--param', 'document_column=d', '--dry-run']) == 0",
        "embed": f"from cli.main import main\nassert main(['submit', '--model', 'minilm', '--input', "
                 f"'{tmp_path / 'corpus.parquet'}', '--output', '{tmp_path / 'out'}', '--dry-run']) == 0",
        "openai batch": f"from cli.main import main\nassert main(['submit', '--input', '{batch}', '--output', "
                        f"'{tmp_path / 'out2'}', '--dry-run']) == 0",
    }
    for name, code in runs.items():
        assert loaded_after(code, tmp_path) == [], name


def test_the_engine_names_still_load_on_first_use(tmp_path):
    code = "import engine\nfrom engine import Engine, SamplingParams\nfrom engine.generate import LLMEngine\n"
    assert set(loaded_after(code, tmp_path)) >= {"torch", "engine.engine"}
