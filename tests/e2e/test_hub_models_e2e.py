"""Jobs that name their model by Hugging Face Hub id, through a real deployment, with
HF_HUB_OFFLINE=1 and HF_HOME pointing at a Hub cache built on disk from the packaged
weights (tests.support.hub_cache): by id, by @branch, by commit; a branch moving after
submission changes nothing; ids that cannot be fetched are refused at submit naming
the model; two revisions never share cached results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import JobSpec, JobStatus
from tests.support.hub_cache import MINILM, SMOLLM2, WHISPER, build_hub_cache
from tests.support.stack import stack, wait_ready

SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
             "A man is riding a horse.", "A woman is playing violin.", "Two men pushed carts through the woods.",
             "A monkey is playing drums.", "Someone in a gorilla costume is playing a set of drums."] * 3


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The cache, and huggingface_hub's settings pointing at it: in the environment for
    the worker and CLI processes, and in this process's already imported constants."""
    from huggingface_hub import constants
    cache = build_hub_cache(tmp_path_factory.mktemp("hf-home"))
    with pytest.MonkeyPatch.context() as patch:
        for name, value in cache.env().items():
            patch.setenv(name, value)
        patch.setattr(constants, "HF_HOME", str(cache.home))
        patch.setattr(constants, "HF_HUB_CACHE", str(cache.hub))
        patch.setattr(constants, "HF_HUB_OFFLINE", True)
        yield cache


def write_corpus(folder):
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.table({"doc_id": pa.array(range(len(SENTENCES)), pa.int64()), "text": SENTENCES})
    pq.write_table(table, folder / "part-0.parquet", row_group_size=8)
    return folder


def embed(client, model, corpus, output, **changes):
    spec = JobSpec(mode="embed", model=model, input=str(corpus), output=str(output), id_column="doc_id",
                   max_rows_per_shard=8, **changes)
    return client.submit(spec)


def finished(deployment, job, id_column="doc_id"):
    state = job.wait(timeout=300)
    assert state.status == JobStatus.SUCCEEDED, (state.error, deployment.worker_logs())
    return state, job.results().sort_by(id_column)


def reference(folder) -> np.ndarray:
    """sentence-transformers on the snapshot folder itself: the independent reference."""
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(folder), device="cpu").encode(SENTENCES, convert_to_numpy=True)


def cosines(table: pa.Table, expected: np.ndarray) -> np.ndarray:
    got = np.array(table.column("embedding").to_pylist(), dtype=np.float64)
    return (got * expected).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)


@pytest.mark.postgres
@pytest.mark.rabbitmq
def test_jobs_by_hub_id_branch_and_commit_load_exactly_their_commit(hub, tmp_path):
    commits = hub.commits[MINILM]
    with stack("postgres-rabbitmq", tmp_path / "barge") as deployment:
        client = deployment.client()
        corpus = write_corpus(tmp_path / "corpus")
        by_id = embed(client, MINILM, corpus, tmp_path / "by-id")
        by_branch = embed(client, f"{MINILM}@cls-pooling", corpus, tmp_path / "by-branch")
        by_commit = embed(client, f"hf://{MINILM}@{commits['v1.0-same-files']}", corpus, tmp_path / "by-commit")
        # The branch moves after submission (to main's commit): the job keeps the commit it was given.
        (hub.hub / f"models--{MINILM.replace('/', '--')}" / "refs" / "cls-pooling").write_text(commits["main"])

        deployment.start_worker(MINILM, env=hub.env())   # serves the repo: main is loaded, other commits fetched
        expected = {by_id: ("main", hub.snapshot(MINILM, "main")),
                    by_branch: ("cls-pooling", hub.snapshot(MINILM, "cls-pooling")),
                    by_commit: ("v1.0-same-files", hub.snapshot(MINILM, "v1.0-same-files"))}
        tables = {}
        for job, (ref, folder) in expected.items():
            _, tables[ref] = finished(deployment, job)
            record = client.store.get_job(job.id)
            pinned = f"{MINILM}@{commits[ref]}"
            assert record.spec.model == pinned and record.model_key.endswith(f"@{commits[ref]}")
            manifest = json.loads(Path(record.spec.output, "_manifest.json").read_text())
            assert manifest["model"] == pinned and manifest["spec"]["model"] == pinned
            assert cosines(tables[ref], reference(folder)).min() >= 0.9999, ref

    # CLS pooling is another model: the branch's job did not run main's commit.
    assert cosines(tables["cls-pooling"], reference(hub.snapshot(MINILM, "main"))).min() < 0.99


def test_two_revisions_of_one_id_never_share_cached_results(hub, tmp_path):
    with stack("embedded", tmp_path / "barge") as deployment:
        deployment.start_worker(MINILM, env=hub.env())
        client = deployment.client()
        corpus = write_corpus(tmp_path / "corpus")
        first, _ = finished(deployment, embed(client, MINILM, corpus, tmp_path / "main-1", incremental=True))
        # The tag's commit holds main's files byte for byte: only the commit differs.
        other, _ = finished(deployment, embed(client, f"{MINILM}@v1.0-same-files", corpus, tmp_path / "tag",
                                              incremental=True))
        again, _ = finished(deployment, embed(client, MINILM, corpus, tmp_path / "main-2", incremental=True))
    assert (first.rows_reused, other.rows_reused) == (0, 0)
    assert again.rows_reused == len(SENTENCES), "the same revision reuses every row: the cache works"


def test_ids_that_cannot_be_fetched_are_refused_at_submit_naming_the_model(hub, tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    never_cached = "b" * 40
    refused = {"barge-test/no-such-model": "barge-test/no-such-model",
               f"{MINILM}@no-such-branch": "no-such-branch",
               f"{MINILM}@{never_cached}": never_cached,
               f"{SMOLLM2}:Q8_0": "Q8_0"}
    with stack("embedded", tmp_path / "barge") as deployment:
        for model, named in refused.items():
            done = subprocess.run([sys.executable, "-m", "cli", "submit", "--model", model, "--input", str(corpus),
                                   "--output", str(tmp_path / "out")], capture_output=True, text=True,
                                  env={**deployment.env, **_environ(), **hub.env()}, timeout=120)
            assert done.returncode == 2, done.stderr
            assert "job refused: model:" in done.stderr and named in done.stderr, done.stderr
            assert model.split("@")[0].split(":")[0] in done.stderr
        assert deployment.client().jobs() == [], "nothing was recorded or queued"


def test_gguf_and_whisper_by_hub_id(hub, tmp_path):
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    pq.write_table(pa.table({"text": ["The capital of France is"]}), prompts / "part-0.parquet")
    audio = tmp_path / "audio"
    audio.mkdir()
    clips = ["Front_Center", "Rear_Left"]
    pq.write_table(pa.table({"audio": [f"/usr/share/sounds/alsa/{clip}.wav" for clip in clips]}),
                   audio / "part-0.parquet")
    with stack("embedded", tmp_path / "barge") as deployment:
        worker = deployment.spawn_worker(f"{SMOLLM2}:Q4_1", env=hub.env())
        wait_ready(worker)
        whisper = subprocess.Popen([sys.executable, "-m", "cli", "worker", "--model", WHISPER],
                                   env={**_environ(), **deployment.env, **hub.env()},
                                   stdout=open(tmp_path / "whisper.log", "wb"), stderr=subprocess.STDOUT)
        whisper.log_path = tmp_path / "whisper.log"
        deployment.workers.append(whisper)
        wait_ready(whisper)
        client = deployment.client()
        generate = client.submit(JobSpec(mode="generate", model=SMOLLM2, input=str(prompts), output=str(tmp_path / "g"),
                                         params={"max_tokens": 4, "temperature": 0.0}))
        transcribe = client.submit(JobSpec(mode="transcribe", model=f"hf://{WHISPER}", input=str(audio),
                                           input_column="audio", output=str(tmp_path / "t"), params={"language": "en"}))
        _, text = finished(deployment, generate, "row_index")
        _, transcripts = finished(deployment, transcribe, "row_index")
    # The figures MODELS.md gives for these weights: the Hub's files are the packaged ones.
    assert text.column("text")[0].as_py().lstrip().startswith("Paris"), text.column("text")[0]
    said = [t.lower() for t in transcripts.column("text").to_pylist()]
    assert "front" in said[0] and "center" in said[0] and "rear" in said[1] and "left" in said[1], said


def _environ() -> dict[str, str]:
    import os
    return dict(os.environ)
