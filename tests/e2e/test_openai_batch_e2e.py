"""The OpenAI Batch API, driven by the real `openai` package against a real uvicorn
server (`barge serve`) and a real worker process on the embedded default: a batch is a
Barge job, and its answers are the engine's own.

Given keys made with `barge api-key create`, when a client uploads a JSONL file, creates
a batch, polls it and downloads its files, then the bodies parse as the package's own
types and equal what `Engine.generate` / `Engine.embed` return for the same input."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from jobs import JobSpec, JobStatus
from jobs.models import resolve_model
from tests.support.lazy_import import importorskip_lazily
from tests.support.stack import free_port, stack, wait_ready

if TYPE_CHECKING:
    from openai.types import Batch

# imported when a test first uses them, not in every process that collects the suite
openai = importorskip_lazily("openai")
openai_types = importorskip_lazily("openai.types")
chat_types = importorskip_lazily("openai.types.chat")

CHAT_PARAMS = {"max_tokens": 24, "temperature": 0}
QUESTIONS = ["What is the capital of France?", "Name three colours.", "What is 2 + 2?"]
TEXTS = ["A barge carries coal down the river.", "The lock fills with water.", "Steel and grain travel by canal."]
LONG_ASK = "Count from 1 to 300, separated by commas."
SHORT_ASK = "Reply with one word: yes or no?"


MAX_FILE_BYTES = 1_000_000


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    root = tmp_path_factory.mktemp("openai")
    # Two rows a shard: a cancelled or expired batch has committed some lines and not others.
    env = {"BARGE_API_ROWS_PER_SHARD": "2", "BARGE_API_MAX_FILE_BYTES": str(MAX_FILE_BYTES)}
    with stack("embedded", root / "barge", env=env) as deployment:
        _serve(deployment, ["smollm2", "minilm"])
        yield deployment


def _serve(deployment, models: list[str]) -> None:
    """A worker serving `models`, `barge serve` beside it, and two keys (alice's, bob's)."""
    worker = deployment.spawn([sys.executable, "-m", "cli", "worker",
                               *[arg for model in models for arg in ("--model", model)]], "worker-0.log")
    deployment.workers.append(worker)
    port = free_port()
    server = deployment.spawn([sys.executable, "-m", "cli", "serve", "--port", str(port)], "serve.log")
    deployment.workers.append(server)   # stopped with the workers (SIGTERM)
    deployment.base_url = f"http://127.0.0.1:{port}/v1"
    deployment.keys = [deployment.create_api_key(name) for name in ("alice", "bob")]
    wait_ready(worker)
    _wait_serving(server, deployment.base_url)


def _wait_serving(server: subprocess.Popen, base_url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and server.poll() is None:
        try:
            urllib.request.urlopen(base_url + "/batches", timeout=2)
        except urllib.error.HTTPError:   # 401: up, and asking for a key
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"barge serve did not start:\n{Path(server.log_path).read_text()[-3000:]}")


def _client(deployment, key_index: int = 0):
    return openai.OpenAI(base_url=deployment.base_url, api_key=deployment.keys[key_index], max_retries=0)


def _jsonl(lines: list[dict]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def _chat_line(custom_id: str, question: str, **params) -> dict:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": question}], **(params or CHAT_PARAMS)}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def _submit(client, lines: list[dict], endpoint: str, window: str = "24h", **kwargs) -> Batch:
    uploaded = client.files.create(file=("batch.jsonl", _jsonl(lines)), purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window=window, **kwargs)


def _poll(client, batch_id: str, until: tuple[str, ...], timeout_s: float = 300.0, deployment=None) -> Batch:
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in until:
            return batch
        if time.monotonic() > deadline:
            logs = deployment.worker_logs() if deployment else ""
            raise AssertionError(f"batch {batch_id} still {batch.status} after {timeout_s}s\n{logs}")
        time.sleep(0.5)


def _lines(client, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


@pytest.fixture(scope="module")
def smollm2():
    from engine import Engine
    return Engine.from_pretrained(resolve_model("smollm2").path, mode="generate")


def test_chat_batch_completes_with_the_engines_answers(deployment, smollm2):
    from engine import SamplingParams
    client = _client(deployment)
    lines = [_chat_line(f"q-{i}", question) for i, question in enumerate(QUESTIONS)]
    batch = _submit(client, lines, "/v1/chat/completions", metadata={"run": "e2e"})
    assert batch.status in ("validating", "in_progress") and batch.metadata == {"run": "e2e"}

    batch = _poll(client, batch.id, ("completed", "failed"), deployment=deployment)
    assert batch.status == "completed", batch
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (3, 3, 0)
    assert batch.error_file_id is None and batch.completed_at >= batch.created_at

    outputs = {line["custom_id"]: line for line in _lines(client, batch.output_file_id)}
    usages = [chat_types.ChatCompletion.model_validate(line["response"]["body"]).usage for line in outputs.values()]
    assert (batch.usage.input_tokens, batch.usage.output_tokens) == (sum(u.prompt_tokens for u in usages),
                                                                     sum(u.completion_tokens for u in usages))
    expected = smollm2.generate([[{"role": "user", "content": q}] for q in QUESTIONS],
                                SamplingParams(max_tokens=24, temperature=0.0))
    for i, want in enumerate(expected):
        line = outputs[f"q-{i}"]
        assert line["response"]["status_code"] == 200 and line["error"] is None
        body = chat_types.ChatCompletion.model_validate(line["response"]["body"])
        assert body.choices[0].message.content == want.text
        assert body.choices[0].message.content.strip()   # rendered with the chat template: an answer, not <|im_end|>
        assert body.choices[0].finish_reason == want.finish_reason
        assert body.usage.completion_tokens == len(want.token_ids)
        assert body.usage.total_tokens == body.usage.prompt_tokens + body.usage.completion_tokens


def test_embeddings_batch_equals_engine_embed(deployment):
    from engine import Engine
    client = _client(deployment)
    lines = [{"custom_id": "one", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": "minilm", "input": TEXTS[0]}},
             {"custom_id": "many", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": "minilm", "input": TEXTS[1:], "encoding_format": "base64"}}]
    batch = _poll(client, _submit(client, lines, "/v1/embeddings").id, ("completed", "failed"), deployment=deployment)
    assert batch.status == "completed", batch

    bodies = {line["custom_id"]: line["response"]["body"] for line in _lines(client, batch.output_file_id)}
    for item in bodies["many"]["data"]:   # base64 is decoded by the client, as openai's embeddings.create does
        item["embedding"] = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4").tolist()
    outputs = {custom_id: openai_types.CreateEmbeddingResponse.model_validate(body) for custom_id, body in bodies.items()}
    expected = Engine.from_pretrained(resolve_model("minilm").path, mode="embed").embed(TEXTS)
    np.testing.assert_array_equal(np.asarray(outputs["one"].data[0].embedding, np.float32), expected[0])
    many = [np.asarray(item.embedding, np.float32) for item in outputs["many"].data]
    np.testing.assert_array_equal(np.stack(many), expected[1:])
    assert [item.index for item in outputs["many"].data] == [0, 1]
    assert outputs["one"].usage.prompt_tokens > 0


def test_embedding_lines_of_different_dimensions_run_as_one_batch(deployment):
    """Each line its own width, as each is its own request to OpenAI; a width over the
    model's 384 fails the batch at create, naming its line."""
    from engine import Engine
    client = _client(deployment)

    def line(custom_id: str, dimensions: int, **body) -> dict:
        return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
                "body": {"model": "minilm", "input": TEXTS[:2], "dimensions": dimensions, **body}}
    batch = _poll(client, _submit(client, [line("d64", 64), line("d16", 16, encoding_format="base64")],
                                  "/v1/embeddings").id, ("completed", "failed"), deployment=deployment)
    assert batch.status == "completed", batch
    bodies = {line["custom_id"]: line["response"]["body"] for line in _lines(client, batch.output_file_id)}
    engine = Engine.from_pretrained(resolve_model("minilm").path, mode="embed")
    d64 = np.asarray([item["embedding"] for item in bodies["d64"]["data"]], np.float32)
    d16 = np.stack([np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4") for item in bodies["d16"]["data"]])
    np.testing.assert_allclose(d64, engine.embed(TEXTS[:2], dimensions=64), atol=1e-6)
    np.testing.assert_allclose(d16, engine.embed(TEXTS[:2], dimensions=16), atol=1e-6)

    refused = _poll(client, _submit(client, [line("d64", 64), line("d999", 999)], "/v1/embeddings").id,
                    ("completed", "failed"), deployment=deployment)
    assert refused.status == "failed"
    assert [(error.line, error.param) for error in refused.errors.data] == [(2, "body.dimensions")]


def test_completions_batch_parses_as_completion(deployment, smollm2):
    from engine import SamplingParams
    client = _client(deployment)
    lines = [{"custom_id": "c", "method": "POST", "url": "/v1/completions",
              "body": {"model": "smollm2", "prompt": "The river", "max_tokens": 8, "temperature": 0}}]
    batch = _poll(client, _submit(client, lines, "/v1/completions").id, ("completed", "failed"),
                  deployment=deployment)
    body = openai_types.Completion.model_validate(_lines(client, batch.output_file_id)[0]["response"]["body"])
    assert body.choices[0].text == smollm2.generate(["The river"], SamplingParams(max_tokens=8, temperature=0))[0].text


CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                              "population_millions": {"type": "integer", "minimum": 0}},
               "required": ["city", "population_millions"], "additionalProperties": False}


def test_lines_with_their_own_params_and_response_format_run_as_one_batch(deployment, smollm2):
    """Lines differ in max_tokens, temperature, seed, stop and response_format, as real
    batch files do; each answer is the engine's for that line's own params, and a schema
    that does not compile is that line's error, not the batch's."""
    from engine import SamplingParams
    from queueing.inference import row_seed
    client = _client(deployment)
    schema_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True}}
    asks = {  # custom_id -> (question, the line's body params, the engine's SamplingParams for it)
        "short": ("Name three colours.", {"max_tokens": 3, "temperature": 0},
                  dict(max_tokens=3, temperature=0)),
        "stop": ("Count from 1 to 10, separated by commas.", {"max_tokens": 30, "temperature": 0, "stop": ["5"]},
                 dict(max_tokens=30, temperature=0, stop=["5"])),
        "seeded": ("Tell me a fact about rivers.", {"max_tokens": 12, "temperature": 0.9, "seed": 11},
                   dict(max_tokens=12, temperature=0.9, seed=row_seed(11, 2))),   # its row: the third
        "schema": ("Which is the largest city in Japan? Answer in JSON.",
                   {"max_tokens": 40, "temperature": 0, "response_format": schema_format},
                   dict(max_tokens=40, temperature=0, structured={"json_schema": CITY_SCHEMA})),
        "object": ("Give a JSON object with a cat's name.",
                   {"max_tokens": 80, "temperature": 0, "response_format": {"type": "json_object"}},
                   dict(max_tokens=80, temperature=0, structured={"json_object": True})),
    }
    lines = [_chat_line(custom_id, question, **body) for custom_id, (question, body, _) in asks.items()]
    bad_format = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "object",
                                                                                    "properties": 3}}}
    lines.append(_chat_line("bad-schema", "Hi", max_tokens=5, response_format=bad_format))
    batch = _poll(client, _submit(client, lines, "/v1/chat/completions").id, ("completed", "failed"),
                  deployment=deployment)
    assert batch.status == "completed", batch
    assert (batch.request_counts.completed, batch.request_counts.failed) == (5, 1)

    outputs = {line["custom_id"]: chat_types.ChatCompletion.model_validate(line["response"]["body"])
               for line in _lines(client, batch.output_file_id)}
    expected = smollm2.generate([[{"role": "user", "content": question}] for question, _, _ in asks.values()],
                                [SamplingParams(**params) for _, _, params in asks.values()])
    for custom_id, want in zip(asks, expected):
        choice = outputs[custom_id].choices[0]
        assert (choice.message.content, choice.finish_reason) == (want.text, want.finish_reason), custom_id
    assert outputs["short"].usage.completion_tokens == 3 and outputs["short"].choices[0].finish_reason == "length"
    assert "5" not in outputs["stop"].choices[0].message.content
    assert set(json.loads(outputs["schema"].choices[0].message.content)) == {"city", "population_millions"}
    cat = outputs["object"].choices[0]   # a 135M model may run any JSON object to max_tokens
    assert isinstance(json.loads(cat.message.content), dict) if cat.finish_reason == "stop" else \
        cat.message.content.lstrip().startswith("{")
    (failed,) = _lines(client, batch.error_file_id)
    assert failed["custom_id"] == "bad-schema" and failed["response"]["status_code"] == 400
    assert "does not compile" in failed["response"]["body"]["error"]["message"]


def test_logprobs_are_openais_shape_and_the_engines_values(deployment, smollm2):
    from engine import SamplingParams
    client = _client(deployment)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    lines = [_chat_line("top3", question[0]["content"], max_tokens=8, temperature=0, logprobs=True, top_logprobs=3),
             _chat_line("none", question[0]["content"], max_tokens=8, temperature=0)]
    batch = _poll(client, _submit(client, lines, "/v1/chat/completions").id, ("completed", "failed"),
                  deployment=deployment)
    assert batch.status == "completed", batch
    bodies = {line["custom_id"]: chat_types.ChatCompletion.model_validate(line["response"]["body"])
              for line in _lines(client, batch.output_file_id)}
    want = smollm2.generate([question], SamplingParams(max_tokens=8, temperature=0, logprobs=3))[0]
    content = bodies["top3"].choices[0].logprobs.content
    assert [bytes(token.bytes) for token in content] == [token.token for token in want.token_logprobs]
    # equal up to fp32 rounding: the worker's batch holds another row, the engine call here does not
    assert [token.logprob for token in content] == pytest.approx([t.logprob for t in want.token_logprobs], abs=1e-5, rel=2e-5)
    assert [[bytes(top.bytes) for top in token.top_logprobs] for token in content] == \
        [[top.token for top in token.top_logprobs] for token in want.token_logprobs]
    assert [top.logprob for token in content for top in token.top_logprobs] == pytest.approx(
        [top.logprob for token in want.token_logprobs for top in token.top_logprobs], abs=1e-5, rel=2e-5)
    assert b"".join(bytes(token.bytes) for token in content).decode() == bodies["top3"].choices[0].message.content
    assert bodies["none"].choices[0].logprobs is None
    assert bodies["none"].choices[0].message.content == bodies["top3"].choices[0].message.content

    completion_line = {"custom_id": "c", "method": "POST", "url": "/v1/completions",
                       "body": {"model": "smollm2", "prompt": "The river", "max_tokens": 6, "temperature": 0,
                                "logprobs": 2}}
    batch = _poll(client, _submit(client, [completion_line], "/v1/completions").id, ("completed", "failed"),
                  deployment=deployment)
    body = openai_types.Completion.model_validate(_lines(client, batch.output_file_id)[0]["response"]["body"])
    want = smollm2.generate(["The river"], SamplingParams(max_tokens=6, temperature=0, logprobs=2))[0]
    assert body.choices[0].logprobs.token_logprobs == pytest.approx([t.logprob for t in want.token_logprobs],
                                                                    abs=1e-5, rel=2e-5)
    assert "".join(body.choices[0].logprobs.tokens) == body.choices[0].text == want.text
    assert all(len(top) == 2 for top in body.choices[0].logprobs.top_logprobs)


def test_a_malformed_file_fails_the_batch_line_by_line_and_runs_nothing(deployment):
    client = _client(deployment)
    jobs_before = len(deployment.client().jobs(limit=1000))
    good = _chat_line("a", "Hi")
    no_id = {key: value for key, value in _chat_line("x", "Hi").items() if key != "custom_id"}
    unknown_model = _chat_line("c", "Hi")
    unknown_model["body"]["model"] = "gpt-4o"
    data = _jsonl([good]) + b"{not json\n" + _jsonl([no_id, _chat_line("a", "again"), unknown_model])
    uploaded = client.files.create(file=("bad.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")

    assert batch.status == "failed" and batch.failed_at is not None
    errors = [(error.line, error.code, error.param) for error in batch.errors.data]
    assert errors == [(2, "invalid_json_line", None), (3, "missing_required_parameter", "custom_id"),
                      (4, "duplicate_custom_id", "custom_id"), (5, "model_not_found", "body.model")]
    assert client.batches.retrieve(batch.id).status == "failed"
    assert len(deployment.client().jobs(limit=1000)) == jobs_before   # no job, no GPU time

    with pytest.raises(openai.BadRequestError):   # an endpoint the server does not have
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/moderations", completion_window="24h")


def test_a_server_killed_between_recording_a_batch_and_making_its_job_leaves_a_batch_that_fails(deployment):
    """No dead ends: the batch is recorded before its job, so a crash in between leaves a
    batch that reads `validating`, then `failed` once its job is clearly never coming,
    and no job that nobody reads."""
    port = free_port()
    doomed = deployment.spawn([sys.executable, "-m", "cli", "serve", "--port", str(port)], "serve-doomed.log",
                  env={"BARGE_FAILPOINTS": "after_batch_record=kill"})
    deployment.workers.append(doomed)
    doomed_url = f"http://127.0.0.1:{port}/v1"
    _wait_serving(doomed, doomed_url)
    client = _client(deployment)
    uploaded = client.files.create(file=("batch.jsonl", _jsonl([_chat_line("a", "Hi")])), purpose="batch")
    jobs_before = len(deployment.client().jobs(limit=1000))
    with pytest.raises(openai.APIConnectionError):   # the server dies inside create
        openai.OpenAI(base_url=doomed_url, api_key=deployment.keys[0], max_retries=0).batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert doomed.wait(timeout=30) == 137
    (orphan,) = [batch for batch in client.batches.list(limit=100).data if batch.input_file_id == uploaded.id]
    assert orphan.status == "validating"                       # its job may still be on the way
    assert len(deployment.client().jobs(limit=1000)) == jobs_before   # and none was made
    port = free_port()
    patient = deployment.spawn([sys.executable, "-m", "cli", "serve", "--port", str(port)], "serve-short.log",
                   env={"BARGE_API_ORPHAN_AFTER_S": "1"})
    deployment.workers.append(patient)
    _wait_serving(patient, f"http://127.0.0.1:{port}/v1")
    time.sleep(1.5)
    settled = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=deployment.keys[0],
                            max_retries=0).batches.retrieve(orphan.id)
    assert settled.status == "failed" and settled.errors.data[0].code == "batch_failed"
    assert client.batches.retrieve(orphan.id).status == "failed"   # settled once, for every reader


def test_keys_see_only_their_own_files_and_batches(deployment):
    alice, bob = _client(deployment, 0), _client(deployment, 1)
    batch = _submit(alice, [_chat_line("k", "Hi", max_tokens=2, temperature=0)], "/v1/chat/completions")

    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=deployment.base_url, api_key="sk-barge-wrong", max_retries=0).batches.list()
    with pytest.raises(openai.NotFoundError):
        bob.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        bob.batches.cancel(batch.id)
    with pytest.raises(openai.NotFoundError):
        bob.files.content(batch.input_file_id)
    with pytest.raises(openai.NotFoundError):   # not an id of ours: never reaches SQL or a path
        alice.files.retrieve("../../barge.db")
    with pytest.raises(openai.NotFoundError):
        alice.batches.retrieve("batch_' OR '1'='1")
    assert batch.input_file_id in [f.id for f in alice.files.list()]
    assert batch.input_file_id not in [f.id for f in bob.files.list()]
    assert batch.id not in [b.id for b in bob.batches.list()]
    assert alice.batches.retrieve(batch.id).id == batch.id


def test_list_pages_with_after_and_limit(deployment):
    client = _client(deployment, 1)
    created = [_submit(client, [_chat_line("p", "Hi", max_tokens=1, temperature=0)], "/v1/chat/completions").id
               for _ in range(3)]
    first = client.batches.list(limit=2)
    assert [b.id for b in first.data] == created[::-1][:2] and first.has_more
    assert [b.id for b in client.batches.list(limit=2, after=first.data[-1].id).data] == created[:1]
    assert [b.id for b in client.batches.list(limit=1)] [:3] == created[::-1]   # auto-pagination


def test_a_webhook_asked_for_in_metadata_is_signed_with_the_secret_create_answered(deployment):
    from tests.support.receiver import WebhookReceiver
    from webhooks import verify
    client = _client(deployment)
    lines = [{"custom_id": "w", "method": "POST", "url": "/v1/embeddings", "body": {"model": "minilm", "input": "x"}}]
    with WebhookReceiver() as receiver:
        batch = _submit(client, lines, "/v1/embeddings", metadata={"webhook_url": receiver.url, "team": "a"})
        secret = batch.metadata["webhook_secret"]
        headers, body = receiver.wait_for(1, timeout_s=120)[0]
    payload = verify(secret, headers, body)
    assert payload["type"] == "job.succeeded" and payload["data"]["metadata"]["openai_batch_id"] == batch.id
    assert client.batches.retrieve(batch.id).metadata == {"webhook_url": receiver.url, "team": "a"}   # shown once
    with pytest.raises(openai.BadRequestError) as refused:   # the job's own check of the URL
        _submit(client, lines, "/v1/embeddings", metadata={"webhook_url": "ftp://example.com/hook"})
    assert refused.value.body["param"] == "metadata.webhook_url"


def test_uploads_over_the_size_or_line_limits_are_refused(deployment):
    client = _client(deployment)
    with pytest.raises(openai.APIStatusError) as too_big:
        client.files.create(file=("big.jsonl", b"x" * (MAX_FILE_BYTES + 1)), purpose="batch")
    assert too_big.value.status_code == 413
    with pytest.raises(openai.BadRequestError, match="at most 50000 requests"):
        client.files.create(file=("long.jsonl", b"{}\n" * 50_001), purpose="batch")
    with pytest.raises(openai.BadRequestError):
        client.files.create(file=("x.jsonl", b"{}\n"), purpose="fine-tune")


def _long_batch(client, window: str = "24h") -> Batch:
    """Four requests answered in a few tokens, then twenty that run to 400: minutes of work
    on a CPU, of which the first shards are done within seconds."""
    lines = [_chat_line(f"n-{i}", SHORT_ASK if i < 4 else LONG_ASK, max_tokens=400, temperature=0)
             for i in range(24)]
    return _submit(client, lines, "/v1/chat/completions", window=window)


def _assert_partial(client, batch: Batch, code: str) -> None:
    outputs, errors = _lines(client, batch.output_file_id), _lines(client, batch.error_file_id)
    assert outputs and errors, batch   # some lines ran, some did not
    assert sorted(line["custom_id"] for line in outputs + errors) == sorted(f"n-{i}" for i in range(24))
    assert all(line["error"]["code"] == code and line["response"] is None for line in errors)
    for line in outputs:
        chat_types.ChatCompletion.model_validate(line["response"]["body"])
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (24, len(outputs), len(errors))


def test_cancel_mid_run_keeps_what_finished(deployment):
    client = _client(deployment)
    batch = _long_batch(client)
    _wait_some_done(client, batch.id)
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status in ("cancelling", "cancelled") and cancelled.cancelling_at is not None
    batch = _poll(client, batch.id, ("cancelled",), timeout_s=120, deployment=deployment)
    assert batch.cancelled_at is not None
    _assert_partial(client, batch, "batch_cancelled")
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_an_expired_window_keeps_what_finished(deployment):
    client = _client(deployment)
    batch = _long_batch(client, window="30s")
    assert batch.expires_at - batch.created_at == 30
    batch = _poll(client, batch.id, ("expired", "completed"), timeout_s=180, deployment=deployment)
    assert batch.status == "expired" and batch.expired_at is not None
    _assert_partial(client, batch, "batch_expired")


def _wait_some_done(client, batch_id: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while client.batches.retrieve(batch_id).request_counts.completed < 2:
        assert time.monotonic() < deadline, "no line finished"
        time.sleep(0.3)


def test_a_native_generate_job_speaks_chat(deployment, smollm2, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from engine import SamplingParams
    pq.write_table(pa.table({"text": QUESTIONS[:1]}), tmp_path / "questions.parquet")
    params = {"max_tokens": 16, "temperature": 0.0, "chat": True, "system_prompt": "Answer in one sentence."}
    job = deployment.client().submit(JobSpec(mode="generate", model="smollm2", input=str(tmp_path / "questions.parquet"),
                                             output=str(tmp_path / "out"), params=params))
    assert job.wait(timeout=180).status == JobStatus.SUCCEEDED
    messages = [{"role": "system", "content": "Answer in one sentence."}, {"role": "user", "content": QUESTIONS[0]}]
    want = smollm2.generate([messages], SamplingParams(max_tokens=16, temperature=0.0))[0]
    assert job.results().column("text").to_pylist() == [want.text] and want.text.strip()


def test_barge_submit_runs_an_openai_batch_file_and_writes_output_jsonl(deployment, tmp_path):
    import os
    source = tmp_path / "batch.jsonl"
    source.write_bytes(_jsonl([{"custom_id": "e", "method": "POST", "url": "/v1/embeddings",
                                "body": {"model": "minilm", "input": TEXTS[0]}}]))
    done = subprocess.run([sys.executable, "-m", "cli", "submit", "--input", str(source), "--output",
                           str(tmp_path / "out"), "--wait"], env={**os.environ, **deployment.env},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    [line] = [json.loads(text) for text in (tmp_path / "out" / "output.jsonl").read_text().splitlines()]
    body = openai_types.CreateEmbeddingResponse.model_validate(line["response"]["body"])
    assert line["custom_id"] == "e" and len(body.data[0].embedding) == 384
    assert (tmp_path / "out" / "_SUCCESS").exists() and (tmp_path / "out" / "output_errors.jsonl").read_text() == ""

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"custom_id": "x", "method": "POST", "url": "/v1/embeddings", "body": {"model": "nope", '
                   '"input": "x"}}\n')
    refused = subprocess.run([sys.executable, "-m", "cli", "submit", "--input", str(bad), "--output",
                              str(tmp_path / "out2")], env={**os.environ, **deployment.env}, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 2 and "line 1: model_not_found" in refused.stderr


@pytest.mark.postgres
@pytest.mark.rabbitmq
def test_an_embeddings_batch_on_postgresql_and_rabbitmq(tmp_path):
    with stack("postgres-rabbitmq", tmp_path / "barge") as deployment:
        _serve(deployment, ["minilm"])
        client = _client(deployment)
        lines = [{"custom_id": f"t{i}", "method": "POST", "url": "/v1/embeddings",
                  "body": {"model": "minilm", "input": text}} for i, text in enumerate(TEXTS)]
        batch = _poll(client, _submit(client, lines, "/v1/embeddings").id, ("completed", "failed"),
                      deployment=deployment)
        assert batch.status == "completed" and batch.request_counts.completed == 3, batch
        assert sorted(line["custom_id"] for line in _lines(client, batch.output_file_id)) == ["t0", "t1", "t2"]
        with pytest.raises(openai.NotFoundError):
            _client(deployment, 1).batches.retrieve(batch.id)
