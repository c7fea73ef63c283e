"""Downloading by Hub id from a local server that speaks the Hub's API
(tests.support.hub_server, HF_ENDPOINT=http://127.0.0.1:PORT), through huggingface_hub
in real CLI and worker processes: only the files the model needs are fetched; a wrong
name, a wrong revision and a private repo without its token are refused with the
library's reason; a submit pins the commit from the Hub's metadata and fetches only the
configs validation reads, never a weight file; a worker with an empty cache fetches a
job's commit before it claims a shard of it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import JobStatus
from jobs.models import registered_models
from tests.support.hub_server import HubRepo, HubServer
from tests.support.stack import stack

MINILM = "barge-test/all-MiniLM-L6-v2"
PRIVATE = "barge-test/private-minilm"
GGUF = "barge-test/SmolLM2-135M-Instruct-GGUF"
TOKEN = "hf_barge_test_token"
MAIN, CLS = "a" * 39 + "1", "c" * 39 + "2"
NEEDED = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
          "vocab.txt", "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
          "1_Pooling/config.json"}
SENTENCES = ["A man is eating food.", "The girl is carrying a baby.", "A monkey is playing drums."] * 4
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")
# What a submit fetches of MiniLM (jobs.hub_models.SUBMIT_FILES): 1,658 bytes on the
# cls-pooling branch, and nothing of a GGUF repo. Fetching what a worker does (NEEDED, the
# GGUF file), the two submits below took 189.9 MB: model.safetensors 90.9, the GGUF 98.4.
SUBMITTED = {"config.json", "tokenizer_config.json", "modules.json", "sentence_bert_config.json",
             "config_sentence_transformers.json", "1_Pooling/config.json"}
MAX_SUBMIT_BYTES = 10_000


@pytest.fixture(scope="module")
def hub():
    """MiniLM at main and on a branch with CLS pooling, beside files a repo has that Barge
    must not fetch; the same files again in a private repo."""
    folder = Path(registered_models({})["minilm"])
    files = {str(p.relative_to(folder)): p for p in folder.rglob("*") if p.is_file()}
    files.update({"pytorch_model.bin": b"\0" * 1024, "onnx/model.onnx": b"\0" * 512})
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    cls = {**files, "1_Pooling/config.json": json.dumps({**pooling, "pooling_mode_mean_tokens": False,
                                                         "pooling_mode_cls_token": True}).encode()}
    gguf = {"SmolLM2-135M-Instruct.Q4_1.gguf": Path(registered_models({})["smollm2"]), "README.md": b"# GGUF",
            "SmolLM2-135M-Instruct.Q8_0.gguf": b"GGUF" + b"\0" * 1024}   # never fetched: its bytes need not be real
    server = HubServer({MINILM: HubRepo({MAIN: files, CLS: cls}, {"main": MAIN, "cls-pooling": CLS}),
                        PRIVATE: HubRepo({MAIN: files}, {"main": MAIN}, token=TOKEN),
                        GGUF: HubRepo({MAIN: gguf}, {"main": MAIN})}).start()
    yield server
    server.stop()


def hub_env(server: HubServer, home: Path, **extra: str) -> dict[str, str]:
    """huggingface_hub's settings pointed at the server and `home` ("0": set, so that a
    test run's HF_HUB_OFFLINE=1 is overridden)."""
    return {"HF_ENDPOINT": server.endpoint, "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0", "HF_TOKEN": "", **extra}


def barge(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=300)


def test_pull_fetches_only_the_files_the_model_needs(hub, tmp_path):
    pulled = barge(hub_env(hub, tmp_path / "home"), "models", "pull", MINILM)
    assert pulled.returncode == 0, pulled.stderr
    assert hub.downloaded(MINILM) == NEEDED      # no pytorch_model.bin, ONNX, README or data_config.json
    snapshot = tmp_path / "home" / "hub" / "models--barge-test--all-MiniLM-L6-v2" / "snapshots" / MAIN
    assert sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file()) == sorted(NEEDED)
    assert (snapshot.parent.parent / "refs" / "main").read_text() == MAIN

    # Pulled once, found offline: what an air-gapped worker does.
    offline = barge(hub_env(hub, tmp_path / "home", HF_HUB_OFFLINE="1"), "models", "pull", MINILM)
    assert offline.returncode == 0 and MAIN in offline.stdout, offline.stderr
    listed = barge(hub_env(hub, tmp_path / "home", HF_HUB_OFFLINE="1"), "models", "list")
    cached = [line.split() for line in listed.stdout.splitlines() if line.strip().startswith(MINILM)]
    assert [line[:3] for line in cached] == [[f"{MINILM}@{MAIN[:12]}", "main", "embed,score"]], listed.stdout
    assert any(line.split()[:2] == ["minilm", "embed,score"] for line in listed.stdout.splitlines()), "registered too"


def test_one_named_gguf_quantization_is_fetched_and_none_named_is_refused(hub, tmp_path):
    env = hub_env(hub, tmp_path / "home")
    ambiguous = barge(env, "models", "pull", GGUF)
    assert ambiguous.returncode == 2 and "several GGUF quantizations" in ambiguous.stderr, ambiguous.stderr
    assert "Q4_1, Q8_0" in ambiguous.stderr and hub.downloaded(GGUF) == set()
    pulled = barge(env, "models", "pull", f"{GGUF}:Q4_1")
    assert pulled.returncode == 0 and "generate model" in pulled.stdout, pulled.stderr
    assert hub.downloaded(GGUF) == {"SmolLM2-135M-Instruct.Q4_1.gguf"}


def test_a_model_that_cannot_be_fetched_is_refused_with_the_library_reason(hub, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    pq.write_table(pa.table({"text": SENTENCES}), corpus / "part-0.parquet")
    cases = {"barge-test/no-such-model": "RepositoryNotFoundError", f"{MINILM}@no-such-branch": "RevisionNotFoundError",
             PRIVATE: "RepositoryNotFoundError"}
    with stack("embedded", tmp_path / "barge") as deployment:
        env = {**hub_env(hub, tmp_path / "home"), **deployment.env}
        for model, reason in cases.items():
            done = barge(env, "submit", "--model", model, "--input", str(corpus), "--output", str(tmp_path / "out"))
            assert done.returncode == 2, done.stderr
            assert f"job refused: model: {model!r} cannot be fetched" in done.stderr and reason in done.stderr, done.stderr
        assert deployment.client().jobs() == []
        with_token = barge({**env, "HF_TOKEN": TOKEN}, "submit", "--model", PRIVATE, "--input", str(corpus),
                           "--output", str(tmp_path / "private"))
        assert with_token.returncode == 0, with_token.stderr


def test_a_submit_pins_the_commit_from_metadata_and_fetches_no_weights(hub, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    pq.write_table(pa.table({"text": SENTENCES}), corpus / "part-0.parquet")
    with stack("embedded", tmp_path / "barge") as deployment:
        env = {**hub_env(hub, tmp_path / "client-home"), **deployment.env}   # a client with an empty cache
        mark = len(hub.served)
        embed = barge(env, "submit", "--model", f"{MINILM}@cls-pooling", "--input", str(corpus), "--output",
                      str(tmp_path / "embed"))
        generate = barge(env, "submit", "--mode", "generate", "--model", f"{GGUF}:Q4_1", "--input", str(corpus),
                         "--output", str(tmp_path / "generate"))
        assert embed.returncode == 0 and generate.returncode == 0, (embed.stderr, generate.stderr)
        fetched = hub.file_bytes(since=mark)
        client = deployment.client()
        records = {job.spec.mode: job for job in (client.store.get_job(state.job_id) for state in client.jobs())}
    assert not [name for _, name in fetched if name.endswith(WEIGHT_SUFFIXES)], fetched
    assert set(fetched) == {(MINILM, name) for name in SUBMITTED}, fetched   # a GGUF repo: nothing at all
    assert sum(fetched.values()) <= MAX_SUBMIT_BYTES, fetched
    # Pinned all the same, from the Hub's metadata: the commit, and the GGUF file in the key.
    assert records["embed"].spec.model == f"{MINILM}@{CLS}" and records["embed"].model_key.endswith(f"@{CLS}")
    assert records["generate"].spec.model == f"{GGUF}@{MAIN}:Q4_1"
    gguf_key = f"hf.{GGUF.replace('/', '--')}.SmolLM2-135M-Instruct.Q4_1@{MAIN}"
    assert records["generate"].model_key == gguf_key


def test_a_worker_with_an_empty_cache_fetches_the_jobs_commit_before_claiming(hub, tmp_path):
    from sentence_transformers import SentenceTransformer
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    pq.write_table(pa.table({"text": SENTENCES}), corpus / "part-0.parquet")
    with stack("embedded", tmp_path / "barge") as deployment:
        worker_home = tmp_path / "worker-home"          # another machine's cache: nothing of the submitter's
        deployment.start_worker(MINILM, env=hub_env(hub, worker_home))
        submitted = barge({**hub_env(hub, tmp_path / "submit-home"), **deployment.env}, "submit", "--model",
                          f"{MINILM}@cls-pooling", "--input", str(corpus), "--output", str(tmp_path / "out"),
                          "--max-rows-per-shard", "4")
        assert submitted.returncode == 0, submitted.stderr
        job_id = re.search(r"job (\S+) queued", submitted.stdout).group(1)
        state = deployment.client().job(job_id).wait(timeout=300)
        assert state.status == JobStatus.SUCCEEDED, (state.error, deployment.worker_logs())
        table = deployment.client().job(job_id).results().sort_by("row_index")
    snapshot = worker_home / "hub" / "models--barge-test--all-MiniLM-L6-v2" / "snapshots" / CLS
    assert snapshot.is_dir(), "the worker fetched the job's commit into its own cache"
    expected = SentenceTransformer(str(snapshot), device="cpu").encode(SENTENCES)
    got = np.array(table.column("embedding").to_pylist())
    cosine = (got * expected).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosine.min() >= 0.9999
