"""Malformed batch files through the real app (POST /v1/files, POST /v1/batches, GET
/v1/batches/{id}) over a real store, SQLite file and PostgreSQL: every answer is 200 with
the batch `failed` and each bad line named by code, param and physical line, never a 500
(which the openai client would retry three times), and no job made.

The corpus and what each line must give: tests/support/bad_jsonl.py."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.batch_input import CHAT, EMBEDDINGS
from jobs.api_keys import ApiKeys
from jobs.client import Client
from jobs.settings import Settings
from tests.support import bad_jsonl
from tests.support.bad_jsonl import corpus, file_of
from tests.integration.test_store import postgres_url, store, store_url  # noqa: F401 (fixtures)

FAMILIES = [bad_jsonl.truncated, bad_jsonl.huge_numbers, bad_jsonl.deep_nesting, bad_jsonl.lone_surrogates,
            bad_jsonl.nul_bytes, bad_jsonl.byte_order_marks, bad_jsonl.line_breaks_in_strings, bad_jsonl.wrong_types,
            bad_jsonl.long_values]


@pytest.fixture
def http(store, tmp_path, monkeypatch):
    """The app with a key, serving one model per endpoint: folders whose config.json alone
    says the mode (jobs.models.model_mode); no weights are read, as no job is made."""
    for name, architecture in (("smollm2", "LlamaForCausalLM"), ("minilm", "BertModel")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    monkeypatch.setenv("BARGE_MODELS", f"smollm2={tmp_path / 'smollm2'},minilm={tmp_path / 'minilm'}")
    client = Client(settings=Settings.from_env({"BARGE_DATA_DIR": str(tmp_path / "data"),
                                                "BARGE_DATABASE_URL": store.url}))
    secret = ApiKeys(store.engine).create("corpus").secret
    with TestClient(create_app(client), base_url="http://localhost",
                    headers={"Authorization": f"Bearer {secret}"}) as http:
        yield http
    assert client.jobs(limit=10) == []   # a refused file makes no job


def _refused(http: TestClient, data: bytes, endpoint: str) -> list[tuple]:
    """Upload, create, read: the batch's errors as (line, code, param), each answer checked."""
    uploaded = http.post("/v1/files", files={"file": ("corpus.jsonl", data)}, data={"purpose": "batch"})
    assert uploaded.status_code == 200, uploaded.text[:500]
    created = http.post("/v1/batches", json={"input_file_id": uploaded.json()["id"], "endpoint": endpoint,
                                             "completion_window": "24h"})
    assert created.status_code == 200, created.text[:500]
    read = http.get(f"/v1/batches/{created.json()['id']}")
    assert read.status_code == 200 and read.json()["errors"] == created.json()["errors"]
    batch = created.json()
    assert batch["status"] == "failed", batch
    return [(error["line"], error["code"], error["param"]) for error in batch["errors"]["data"]]


@pytest.mark.parametrize("family", FAMILIES, ids=[family.__name__ for family in FAMILIES])
def test_each_family_of_bad_lines_fails_its_batch_naming_each_line(http, family):
    cases = [case for case in family() if case.endpoint == CHAT]
    built = file_of(cases, b"\r\n" if len(cases) % 2 else b"\n")
    assert _refused(http, built.data, CHAT) == built.errors


def test_the_whole_corpus_in_one_file_per_endpoint(http):
    for endpoint, line_end in ((CHAT, b"\r\n"), (EMBEDDINGS, b"\n")):
        built = file_of([case for case in corpus() if case.endpoint == endpoint], line_end, bom=True)
        assert _refused(http, built.data, endpoint) == built.errors
