"""Many hosts that share only PostgreSQL, RabbitMQ and an S3 API server (issue 46).

The client, `barge serve` and two workers each run in their own mount namespace with a
private /tmp, HOME and data dir (tests.support.hosts), so a location on one host's disk
is invisible to the others, as on separate machines. Through the real CLI:

- each misconfiguration is refused before any work, naming what to set: a local input,
  output or model folder at submit, a host-local results cache at `barge worker`, a
  host-local files folder at `barge serve`, a local output in a schedule, a model name
  no worker announced;
- every mode runs on worker A — embed, generate, transcribe, score, and classify with a
  classifier registered on worker A alone (on A's disk alone), which the client, holding
  neither name nor weights, submits by the card A wrote;
- an incremental job run by worker A and then by worker B reuses every row on B;
- an OpenAI batch goes through `barge serve`, a schedule's run-now through the workers;
- a job for a model nobody serves any more says so in `barge status` and sends job.stalled.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.models import registered_models
from tests.integration.s3server import S3Server
from tests.support.hosts import Host, can_isolate
from tests.support.receiver import WebhookReceiver
from tests.support.speech import ALSA_DIR
from tests.support.stack import RABBITMQ_URL, _admin_sql, _delete_queues, free_port, wait_until

pytestmark = pytest.mark.postgres
NUM_DOCS = 40
CLASSIFIER = ("from pathlib import Path; from tests.support.random_classifiers import save_random_bert_classifier; "
              "save_random_bert_classifier(Path('/tmp/models/clf'))")


def s3_filesystem(s3: S3Server):
    import s3fs
    return s3fs.S3FileSystem(**s3.storage_options)


def results(fs, url: str) -> pa.Table:
    parts = sorted(fs.glob(url.removeprefix("s3://").rstrip("/") + "/part-*.parquet"))
    return pa.concat_tables([pq.read_table(fs.open(part, "rb")) for part in parts])


def job_id(done) -> str:
    match = re.search(r"job (\w+) queued", done.stdout)
    assert match, f"not queued:\n{done.stdout}\n{done.stderr}"
    return match.group(1)


def refused(done, *words: str) -> None:
    assert done.returncode != 0, f"accepted:\n{done.stdout}\n{done.stderr}"
    for word in words:
        assert word in done.stderr + done.stdout, f"{word!r} not in:\n{done.stderr[-3000:]}"


def wait_ready(process, timeout_s: float = 420) -> None:
    deadline = time.monotonic() + timeout_s
    while b" ready." not in Path(process.log_path).read_bytes():
        assert process.poll() is None and time.monotonic() < deadline, \
            f"worker did not start:\n{Path(process.log_path).read_text()[-4000:]}"
        time.sleep(0.3)


def stop(process) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except Exception:
            process.kill()
            process.wait()


@pytest.fixture
def deployment(tmp_path):
    if (why := can_isolate()) is not None:
        pytest.skip(why)
    from cryptography.fernet import Fernet
    from torch.utils import cpp_extension
    database = f"barge_hosts_{uuid.uuid4().hex[:10]}"
    _admin_sql(f'CREATE DATABASE "{database}"')
    with S3Server() as s3:
        fs = s3_filesystem(s3)
        for bucket in ("corpus", "out", "barge"):
            s3.create_bucket(bucket)
        shared = {
            "BARGE_DATABASE_URL": f"postgresql://postgres@127.0.0.1:5432/{database}", "BARGE_BROKER_URL": RABBITMQ_URL,
            "BARGE_NAMESPACE": database, "BARGE_SINGLE_HOST": "0", "BARGE_SECRET_KEY": Fernet.generate_key().decode(),
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": s3.endpoint_url, "HF_HUB_OFFLINE": "1", "BARGE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
            "BARGE_HOUSEKEEPING_S": "0.5", "BARGE_DISPATCH_INTERVAL_S": "0.5", "BARGE_UNSERVED_AFTER_S": "3",
            "OMP_NUM_THREADS": "1",
            # The CPU kernels as installed software (built once per machine), not a host's data.
            "TORCH_EXTENSIONS_DIR": cpp_extension.get_default_build_root()}
        hosts = {name: Host(name, shared, tmp_path / "logs") for name in ("client", "server", "worker-a", "worker-b")}
        try:
            yield hosts, s3, fs
        finally:
            _delete_queues({**shared, "BARGE_DATA_DIR": str(tmp_path / "admin")})
            _admin_sql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def test_client_server_and_workers_on_separate_hosts(deployment, tmp_path):
    hosts, s3, fs = deployment
    client, server = hosts["client"], hosts["server"]
    worker_a, worker_b = hosts["worker-a"], hosts["worker-b"]
    texts = [f"Document {i} about barges on the river." for i in range(NUM_DOCS)]
    with fs.open("corpus/docs/part-0.parquet", "wb") as f:
        pq.write_table(pa.table({"doc_id": pa.array(range(NUM_DOCS), pa.int64()), "text": texts}), f)
    with fs.open("corpus/pairs.parquet", "wb") as f:
        pq.write_table(pa.table({"q": ["where do barges sail?"] * 3,
                                 "d": ["On rivers and canals.", "A recipe for bread.", "Barges sail on canals."]}), f)
    with fs.open("corpus/prompts.parquet", "wb") as f:
        pq.write_table(pa.table({"text": ["The capital of France is", "One, two, three,"]}), f)
    with fs.open("corpus/audio.parquet", "wb") as f:
        pq.write_table(pa.table({"audio": pa.array([(ALSA_DIR / "Front_Center.wav").read_bytes()], pa.binary())}), f)

    # Refused before any work, each naming what to set. The client's /tmp is its own.
    refused(client.run(["submit", "--model", "minilm", "--input", "/tmp/in.parquet", "--output", "s3://out/x/"]),
            "input", "BARGE_SHARED_PATHS")
    refused(client.run(["submit", "--model", "minilm", "--input", "s3://corpus/docs/", "--output", "out/"]),
            "output", "this host's disk")
    minilm = registered_models({})["minilm"]
    refused(client.run(["submit", "--model", "/tmp/e5", "--input", "s3://corpus/docs/", "--output", "s3://out/x/"],
                       prelude=f"ln -s {shlex.quote(minilm)} /tmp/e5"), "model", "registered on the workers")
    refused(client.run(["submit", "--model", "team-classifier", "--mode", "classify", "--input", "s3://corpus/docs/",
                        "--output", "s3://out/x/"]), "model", "no worker has announced")
    refused(worker_a.run(["worker", "--model", "minilm"], timeout_s=120), "BARGE_CACHE_URL")
    refused(server.run(["serve", "--no-login-url", "--port", str(free_port())], timeout_s=120), "BARGE_API_FILES_URL")
    refused(client.run(["schedule", "add", "nightly", "--cron", "0 2 * * *", "--mode", "embed", "--model", "minilm",
                        "--input", "s3://corpus/docs/", "--output", "/tmp/nightly/{date:%Y-%m-%d}/"]),
            "template.output")

    cache = {"BARGE_CACHE_URL": "s3://barge/cache"}
    worker_a.env = {**worker_a.env, **cache, "BARGE_MODELS": "team-classifier=/tmp/models/clf"}
    worker_b.env = {**worker_b.env, **cache}
    a = worker_a.spawn(["worker", "--model", "minilm", "--model", "SmolLM2-135M-Instruct", "--model",
                        "whisper-tiny.en", "--model", "team-classifier"], "worker",
                       prelude=f"{shlex.quote(sys.executable)} -c {shlex.quote(CLASSIFIER)}")
    b = None
    serve = None
    try:
        wait_ready(a)

        def run_job(*args: str, timeout_s: float = 300) -> str:
            submitted = client.run(["submit", *args])
            job = job_id(submitted)
            waited = client.run(["wait", job, "--no-progress", "--timeout", str(timeout_s)], timeout_s=timeout_s + 60)
            assert "succeeded" in waited.stdout, waited.stdout + waited.stderr + Path(a.log_path).read_text()[-3000:]
            return job

        first = run_job("--model", "minilm", "--input", "s3://corpus/docs/", "--id-column", "doc_id",
                        "--output", "s3://out/embed-a/", "--incremental")
        assert results(fs, "s3://out/embed-a/").num_rows == NUM_DOCS
        run_job("--mode", "generate", "--model", "smollm2", "--input", "s3://corpus/prompts.parquet",
                "--output", "s3://out/generate/", "--param", "max_tokens=6", "--param", "temperature=0")
        generated = results(fs, "s3://out/generate/").column("text").to_pylist()
        assert generated[0].startswith(" Paris"), generated
        run_job("--mode", "transcribe", "--model", "whisper-tiny.en", "--input", "s3://corpus/audio.parquet",
                "--input-column", "audio", "--output", "s3://out/transcribe/")
        assert "center" in results(fs, "s3://out/transcribe/").column("text")[0].as_py().lower()
        run_job("--mode", "score", "--model", "minilm", "--input", "s3://corpus/pairs.parquet",
                "--param", "query_column=q", "--param", "document_column=d", "--output", "s3://out/score/")
        scores = results(fs, "s3://out/score/").column("score").to_pylist()
        assert scores[1] < min(scores[0], scores[2]), scores
        # Registered on worker A alone, its folder on A's disk alone: submitted by A's card.
        run_job("--mode", "classify", "--model", "team-classifier", "--input", "s3://corpus/docs/",
                "--output", "s3://out/classify/")
        labels = results(fs, "s3://out/classify/").column("label").to_pylist()
        assert len(labels) == NUM_DOCS and None not in labels

        # Worker A goes; worker B, which never saw A's disk, takes the same corpus again.
        stop(a)
        b = worker_b.spawn(["worker", "--model", "minilm"], "worker")
        wait_ready(b)
        second = run_job("--model", "minilm", "--input", "s3://corpus/docs/", "--id-column", "doc_id",
                         "--output", "s3://out/embed-b/", "--incremental")
        reports = [json.loads(client.run(["report", job, "--json"]).stdout) for job in (first, second)]
        assert reports[0]["rows_reused"] == 0 and reports[1]["rows_reused"] == NUM_DOCS, reports
        assert results(fs, "s3://out/embed-b/").sort_by("doc_id").column("embedding").equals(
            results(fs, "s3://out/embed-a/").sort_by("doc_id").column("embedding"))

        # An OpenAI batch through barge serve on its own host, its files on S3.
        server.env = {**server.env, "BARGE_API_FILES_URL": "s3://barge/api"}
        port = free_port()
        serve = server.spawn(["serve", "--no-login-url", "--port", str(port)], "serve")
        key = client.run(["api-key", "create", "--name", "team"]).stdout.strip().splitlines()[-1]
        batch_output = _openai_batch(f"http://127.0.0.1:{port}", key, serve)
        assert [line["custom_id"] for line in batch_output] == ["a", "b"]
        assert all(len(line["response"]["body"]["data"][0]["embedding"]) == 384 for line in batch_output)

        # A schedule, run now, through the workers.
        added = client.run(["schedule", "add", "nightly", "--cron", "0 2 * * *", "--mode", "embed", "--model", "minilm",
                            "--input", "s3://corpus/docs/", "--output", "s3://out/nightly/{date:%Y-%m-%d}/"])
        assert added.returncode == 0, added.stderr
        ran = client.run(["schedule", "run-now", "nightly"])
        assert ran.returncode == 0, ran.stderr
        wait_until(lambda: fs.glob("out/nightly/*/_SUCCESS"), 240, "the schedule's job to commit")

        # Nobody serves Whisper any more: the job says so, and sends job.stalled once.
        with WebhookReceiver() as receiver:
            stalled = job_id(client.run(["submit", "--mode", "transcribe", "--model", "whisper-tiny.en",
                                         "--input", "s3://corpus/audio.parquet", "--input-column", "audio",
                                         "--output", "s3://out/nobody/", "--webhook-url", receiver.url,
                                         "--webhook-event", "job.stalled"]))
            [(_, body)] = receiver.wait_for(1, timeout_s=120)
            assert json.loads(body)["type"] == "job.stalled" and json.loads(body)["data"]["job_id"] == stalled
            status = client.run(["status", stalled]).stdout
            assert "waiting: no live worker serves model whisper-tiny.en" in status, status
            assert client.run(["cancel", stalled]).returncode == 0
    finally:
        for process in (a, b, serve):
            if process is not None:
                stop(process)


def _openai_batch(base_url: str, key: str, serve) -> list[dict]:
    """An embeddings batch through the OpenAI client, as a user sends one; its output lines."""
    import openai
    wait_until(lambda: _answers(base_url), 120, "barge serve to answer")
    lines = [{"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
              "body": {"model": "minilm", "input": text}} for custom_id, text in (("a", "a barge"), ("b", "a river"))]
    api = openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0)
    uploaded = api.files.create(file=("in.jsonl", "\n".join(map(json.dumps, lines)).encode()), purpose="batch")
    batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    done = wait_until(lambda: (b := api.batches.retrieve(batch.id)).status in ("completed", "failed", "expired",
                                                                               "cancelled") and b,
                      240, "the batch to end")
    assert done.status == "completed", (done, Path(serve.log_path).read_text()[-2000:])
    content = api.files.content(done.output_file_id).text
    return sorted((json.loads(line) for line in content.splitlines() if line), key=lambda line: line["custom_id"])


def _answers(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/v1/models", timeout=2) as answer:
            return answer.status == 200
    except urllib.error.HTTPError as error:
        return error.code == 401         # up, and asking for a key
    except OSError:
        return False
