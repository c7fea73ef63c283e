"""Incremental corpus runs through a real deployment (worker process, broker, store):
a second run over a corpus with 1 % of its rows changed computes about those rows,
reuses the rest from the results cache, and writes what a full recomputation writes."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from jobs import JobSpec, JobStatus
from jobs.cache_keys import row_key
from tests.e2e.test_job_e2e import sentence
from tests.support.stack import stack

NUM_ROWS = 1000
NULL_ROW = 7          # an error row: never cached, computed (and failing) every run


def write_corpus(folder, changed: set[int] = frozenset()):
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(2):
        ids = list(range(f * NUM_ROWS // 2, (f + 1) * NUM_ROWS // 2))
        texts = [None if i == NULL_ROW else sentence(i) + (" (revised)" if i in changed else "") for i in ids]
        pq.write_table(pa.table({"doc_id": pa.array(ids, pa.int64()), "text": pa.array(texts, pa.string())}),
                       folder / f"part-{f}.parquet", row_group_size=100)


def run(client, corpus, output, **changes):
    spec = JobSpec(**{"mode": "embed", "model": "minilm", "input": str(corpus), "id_column": "doc_id",
                      "output": str(output), "max_rows_per_shard": 250, "incremental": True, **changes})
    job = client.submit(spec)
    state = job.wait(timeout=300)
    assert state.status == JobStatus.SUCCEEDED, state.error
    run.namespace = client.store.get_job(job.id).cache_namespace
    return state, job.results().sort_by("doc_id")


def assert_same_results(a: pa.Table, b: pa.Table):
    assert a.column("doc_id").to_pylist() == b.column("doc_id").to_pylist()
    assert a.column("error").to_pylist() == b.column("error").to_pylist()
    assert a.column("num_tokens").to_pylist() == b.column("num_tokens").to_pylist()
    ok = [e is None for e in a.column("error").to_pylist()]
    va = np.array([v for v, good in zip(a.column("embedding").to_pylist(), ok) if good])
    vb = np.array([v for v, good in zip(b.column("embedding").to_pylist(), ok) if good])
    assert np.allclose(va, vb, atol=1e-5), float(np.abs(va - vb).max())


def test_second_run_computes_only_changed_rows_and_equals_a_full_run(tmp_path):
    # The cache's SQL on PostgreSQL is tested in tests/integration/test_cache_store.py.
    with stack("embedded", tmp_path / "barge") as deployment:
        deployment.start_worker()
        client = deployment.client()
        corpus = tmp_path / "corpus"
        write_corpus(corpus)
        first, _ = run(client, corpus, tmp_path / "night-1")
        assert (first.rows_reused, first.rows_computed, first.rows_failed) == (0, NUM_ROWS, 1)

        changed = set(range(3, NUM_ROWS, 100))           # 10 rows: 1 % of the corpus
        write_corpus(corpus, changed)
        second, incremental = run(client, corpus, tmp_path / "night-2")
        second_namespace = run.namespace
        assert second.rows_computed == len(changed) + 1    # the changed rows and the null row
        assert second.rows_reused == NUM_ROWS - len(changed) - 1
        assert (second.rows_succeeded, second.rows_failed) == (NUM_ROWS - 1, 1)

        _, full = run(client, corpus, tmp_path / "full", incremental=False)
        assert_same_results(incremental, full)
        manifest = json.loads((tmp_path / "night-2" / "_manifest.json").read_text())
        assert (manifest["stats"]["rows_reused"], manifest["stats"]["rows_computed"]) == (989, 11)

        # Another parameter is another result: nothing is reused.
        other, _ = run(client, corpus, tmp_path / "dims", params={"dimensions": 128})
        assert other.rows_reused == 0

        # A cache file that went missing costs a recomputation of its rows, not a wrong row.
        cache_file = max((tmp_path / "barge" / "cache" / second_namespace).glob("*.parquet"),
                         key=lambda p: p.stat().st_size)          # one of the first night's shards
        lost_keys = set(pq.read_table(cache_file).column("_cache_key").to_pylist())
        texts = pq.read_table(corpus).column("text").to_pylist()
        lost_rows = sum(row_key(text) in lost_keys for text in texts)   # some are of rows changed since
        assert lost_rows > 100
        cache_file.unlink()
        again, rerun = run(client, corpus, tmp_path / "night-3")
        assert again.rows_computed == lost_rows + 1 and again.rows_reused == NUM_ROWS - lost_rows - 1
        assert_same_results(rerun, full)
        # ... and the rows computed again are cached again
        fourth, _ = run(client, corpus, tmp_path / "night-4")
        assert fourth.rows_computed == 1
