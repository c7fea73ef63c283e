"""OpenAI batch lines naming a LoRA adapter as their model, BASE:ADAPTER (api.batch_adapters,
issue 44): the name resolved against the deployment's BARGE_LORA_MODULES, each line's rows
given its adapter in the job's adapter column, and every refusal naming its line and
body.model. The adapter checks are real (jobs.adapters on a hand-written adapter_config.json
and safetensors header over a config.json base); no weights, no torch."""

import json
import struct

import pytest

from api.batch_adapters import (BatchAdapters, LineModel, adapter_problem, lora_module_bases, lora_modules,
                                served_adapters, split_model)
from api.batch_input import CHAT, COMPLETIONS, EMBEDDINGS, BatchRequests, parse_batch
from api.batch_output import batch_output
from api.batch_store import read_requests, write_requests
from api.local_batch import check_jsonl, describe_requests
from jobs.settings import Settings
from jobs.spec import JobSpecError

MODELS = {"smollm2": "generate", "qwen3": "generate", "minilm": "embed", "org:model": "generate"}
LOCATIONS = {"support": "s3://adapters/support", "legal": "s3://adapters/legal"}
HIDDEN, INTERMEDIATE, LAYERS, HEADS = 64, 128, 2, 4


def line(custom_id: str, model: str, url: str = COMPLETIONS, **body) -> dict:
    body = {"model": model, **({"prompt": "Hi"} if url == COMPLETIONS else {"input": "Hi"}), **body}
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def jsonl(*lines: dict) -> bytes:
    return "".join(json.dumps(request) + "\n" for request in lines).encode()


class Checks:
    """A fake check: the problem of each adapter name (None: it serves), and the calls made."""

    def __init__(self, problems: dict[str, str] | None = None):
        self.problems = problems or {}
        self.calls: list[tuple[str, str, str]] = []

    def __call__(self, base: str, name: str, location: str) -> str | None:
        self.calls.append((base, name, location))
        return self.problems.get(name)


def errors_of(result) -> list[tuple]:
    assert isinstance(result, list), result
    return [(error.line, error.code, error.param) for error in result]


@pytest.mark.parametrize("model, expected", [
    ("smollm2", LineModel("smollm2")),
    ("smollm2:support", LineModel("smollm2", "support")),
    ("org:model", LineModel("org:model")),               # a served name with a colon is the base whole
    ("org:model:support", LineModel("org:model", "support")),
    ("nope:support", LineModel("nope:support")),         # unknown base: whole, for parse_batch to refuse
    ("smollm2:", LineModel("smollm2:")),
])
def test_a_model_is_a_served_base_or_base_colon_adapter(model, expected):
    assert split_model(model, MODELS) == expected


def test_lora_modules_are_name_location_pairs_and_paths_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = {"BARGE_LORA_MODULES": "support=s3://adapters/support, legal = adapters/legal ,org:model:de=s3://a/de"}
    assert lora_modules(env) == {"support": "s3://adapters/support", "legal": str(tmp_path / "adapters" / "legal"),
                                 "de": "s3://a/de"}
    assert lora_module_bases(env) == {"de": "org:model"}, "BASE:name=location names the base of the name alone"
    assert lora_modules({}) == {} and lora_module_bases({}) == {}
    for bad in ("support", "=s3://x", "support=", ":b=s3://x", "a:=s3://x"):
        with pytest.raises(ValueError, match="BARGE_LORA_MODULES: entry"):
            lora_modules({"BARGE_LORA_MODULES": bad})


def test_an_adapter_named_alone_runs_on_the_one_generate_model_served():
    """vLLM's `model: "support"`: with one base served, the adapter's name is enough; the
    output names the model as the line did."""
    one_base = {"smollm2": ("generate",), "minilm": ("embed",)}
    checks = Checks()
    batch = parse_batch(jsonl(line("a", "support"), line("b", "smollm2"), line("c", "smollm2:support")),
                        COMPLETIONS, one_base, adapters=BatchAdapters(LOCATIONS, checks))
    assert batch.model == "smollm2" and batch.line_models == ["support", "smollm2", "smollm2:support"]
    assert batch.row_adapters == [LOCATIONS["support"], None, LOCATIONS["support"]]
    assert checks.calls == [("smollm2", "support", LOCATIONS["support"])]


def test_an_adapter_named_alone_among_several_bases_needs_its_entry_to_name_one():
    # Given three generate models served: the adapter alone is refused, telling both ways out
    refused = parse_batch(jsonl(line("a", "support")), COMPLETIONS, MODELS, adapters=BatchAdapters(LOCATIONS, Checks()))
    assert errors_of(refused) == [(1, "model_not_found", "body.model")]
    assert "as BASE:support" in refused[0].message and "BASE:support=LOCATION" in refused[0].message
    # An entry naming its base settles it, and a base not served is refused by name
    batch = parse_batch(jsonl(line("a", "support"), line("b", "qwen3")), COMPLETIONS, MODELS,
                        adapters=BatchAdapters(LOCATIONS, Checks(), bases={"support": "qwen3"}))
    assert batch.model == "qwen3" and batch.row_adapters == [LOCATIONS["support"], None]
    gone = parse_batch(jsonl(line("a", "support")), COMPLETIONS, MODELS,
                       adapters=BatchAdapters(LOCATIONS, Checks(), bases={"support": "llama"}))
    assert errors_of(gone) == [(1, "model_not_found", "body.model")] and "'llama'" in gone[0].message
    # A served model's name wins over an adapter's
    shadowed = parse_batch(jsonl(line("a", "qwen3")), COMPLETIONS, MODELS,
                           adapters=BatchAdapters({"qwen3": "s3://adapters/q"}, Checks()))
    assert shadowed.row_adapters == [None]


def test_lines_of_adapters_and_of_the_base_become_one_job_with_an_adapter_column():
    # Given lines naming the base, two adapters, and one of them again
    checks = Checks()
    batch = parse_batch(jsonl(line("a", "smollm2"), line("b", "smollm2:support", prompt=["x", "y"]),
                              line("c", "smollm2:legal"), line("d", "smollm2:support")),
                        COMPLETIONS, MODELS, adapters=BatchAdapters(LOCATIONS, checks))
    # Then each row carries its line's adapter location, the job names the column, and the
    # output names each line's model as the line gave it
    assert batch.model == "smollm2"
    assert batch.params == {"params_column": "params", "adapter_column": "adapter"}
    assert batch.row_adapters == [None, LOCATIONS["support"], LOCATIONS["support"], LOCATIONS["legal"],
                                  LOCATIONS["support"]]
    assert batch.line_models == ["smollm2", "smollm2:support", "smollm2:legal", "smollm2:support"]
    assert checks.calls == [("smollm2", "support", LOCATIONS["support"]), ("smollm2", "legal", LOCATIONS["legal"])], \
        "each adapter checked once per batch"


def test_a_batch_of_the_base_alone_names_no_adapter_column():
    batch = parse_batch(jsonl(line("a", "smollm2"), line("b", "smollm2")), COMPLETIONS, MODELS,
                        adapters=BatchAdapters(LOCATIONS, Checks()))
    assert batch.params == {"params_column": "params"} and batch.row_adapters == [None, None]


def test_each_line_naming_a_bad_adapter_is_refused_naming_its_line_and_body_model():
    checks = Checks({"legal": "adapter legal: r=64 exceeds this engine's max_lora_rank=16"})
    result = parse_batch(jsonl(line("a", "smollm2:support"), line("b", "smollm2:legal"), line("c", "smollm2:nope"),
                               line("d", "smollm2:legal"), line("e", "qwen3:support"), line("f", "support")),
                         COMPLETIONS, MODELS, adapters=BatchAdapters(LOCATIONS, checks))
    assert errors_of(result) == [(2, "invalid_value", "body.model"), (3, "model_not_found", "body.model"),
                                 (4, "invalid_value", "body.model"), (5, "mismatched_model", "body.model"),
                                 (6, "model_not_found", "body.model")]
    assert "r=64 exceeds" in result[0].message and result[0].message == result[2].message
    assert "adapter 'nope'" in result[1].message and "legal, support" in result[1].message
    assert "differs from the batch's 'smollm2'" in result[3].message
    assert "as BASE:support" in result[4].message, "an adapter alone among several bases is told how to name it"
    assert [call[1] for call in checks.calls] == ["support", "legal"], "a mismatched base reads no adapter"


def test_adapters_serve_generate_endpoints_only_and_none_are_served_unless_registered():
    embed = parse_batch(jsonl(line("a", "minilm:support", EMBEDDINGS)), EMBEDDINGS, MODELS,
                        adapters=BatchAdapters(LOCATIONS, Checks()))
    assert errors_of(embed) == [(1, "invalid_value", "body.model")] and "takes no adapter" in embed[0].message
    unregistered = parse_batch(jsonl(line("a", "smollm2:support")), COMPLETIONS, MODELS)
    assert errors_of(unregistered) == [(1, "model_not_found", "body.model")]
    assert "BARGE_LORA_MODULES lists none" in unregistered[0].message
    chat = {"custom_id": "a", "method": "POST", "url": CHAT,
            "body": {"model": "smollm2:support", "messages": [{"role": "user", "content": "Hi"}]}}
    assert parse_batch(jsonl(chat), CHAT, MODELS, adapters=BatchAdapters(LOCATIONS, Checks())).row_adapters == [
        LOCATIONS["support"]]


def test_the_stored_requests_carry_each_lines_model_and_adapter_and_the_output_names_it(tmp_path):
    batch = parse_batch(jsonl(line("a", "smollm2"), line("b", "smollm2:support")), COMPLETIONS, MODELS,
                        adapters=BatchAdapters(LOCATIONS, Checks()))
    write_requests(str(tmp_path), batch)
    requests = read_requests(str(tmp_path))
    assert requests.line_models == ["smollm2", "smollm2:support"]
    row = {"text": "ok", "finish_reason": "stop", "num_prompt_tokens": 1, "num_output_tokens": 1, "error": None}
    made = batch_output(COMPLETIONS, batch.model, requests, [row, row], "succeeded")
    assert [json.loads(out)["response"]["body"]["model"] for out in made.output_lines] == ["smollm2",
                                                                                           "smollm2:support"]
    assert "lines naming adapters: smollm2:support" in describe_requests(batch)


# -- the real check (jobs.adapters), on a hand-written adapter ----------------------------------

def save_base(folder) -> str:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
        "num_attention_heads": HEADS, "num_hidden_layers": LAYERS}))
    return str(folder)


def save_adapter(folder, rank: int, in_features: int = HIDDEN) -> str:
    """q_proj of every layer: lora_A [r, in], lora_B [out, r]; a header and no tensor data
    (only the header is read at submit)."""
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
                                                            "target_modules": ["q_proj"]}))
    prefix = "base_model.model.model.layers"
    header = {f"{prefix}.{layer}.self_attn.q_proj.lora_{half}.weight": {"dtype": "F32", "shape": shape,
                                                                         "data_offsets": [0, 0]}
              for layer in range(LAYERS) for half, shape in (("A", [rank, in_features]), ("B", [HIDDEN, rank]))}
    data = json.dumps(header).encode()
    (folder / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(data)) + data)
    return str(folder)


@pytest.fixture
def deployment(tmp_path):
    """A base registered as `base`, adapters registered by name, and an env naming both."""
    base = save_base(tmp_path / "base")
    locations = {"good": save_adapter(tmp_path / "good", 4), "large": save_adapter(tmp_path / "large", 64),
                 "misfit": save_adapter(tmp_path / "misfit", 4, in_features=32), "gone": str(tmp_path / "gone")}
    env = {"BARGE_MODELS": f"base={base}", "BARGE_DATA_DIR": str(tmp_path / "data"),
           "BARGE_LORA_MODULES": ",".join(f"{name}={location}" for name, location in locations.items())}
    return env, locations


def test_the_real_check_refuses_an_adapter_by_its_name_never_its_location(deployment, tmp_path):
    env, locations = deployment
    settings = Settings.from_env(env)
    assert adapter_problem("base", "good", locations["good"], settings, env) is None
    problems = {name: adapter_problem("base", name, locations[name], settings, env)
                for name in ("large", "misfit", "gone")}
    assert "adapter large: r=64 exceeds this engine's max_lora_rank=16" in problems["large"]
    assert "adapter misfit: layers.0.q_proj.lora_A has shape [4, 32]" in problems["misfit"]
    assert "adapter gone cannot be read: FileNotFoundError" in problems["gone"]
    assert not any(str(tmp_path) in problem for problem in problems.values()), "no server path is shown"


def test_on_many_hosts_an_adapter_on_this_hosts_disk_is_refused(deployment, tmp_path):
    env, locations = deployment
    many_hosts = Settings.from_env({**env, "BARGE_DATABASE_URL": "postgresql://db.example/barge"})
    problem = adapter_problem("base", "good", locations["good"], many_hosts, env)
    assert "workers of this deployment of many hosts cannot reach" in problem and str(tmp_path) not in problem
    shared = {**env, "BARGE_SHARED_PATHS": str(tmp_path)}
    assert adapter_problem("base", "good", locations["good"], many_hosts, shared) is None


def test_a_local_jsonl_naming_a_bad_adapter_is_refused_at_submit_naming_the_line(deployment, tmp_path, monkeypatch):
    env, locations = deployment
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    source = tmp_path / "batch.jsonl"
    source.write_bytes(jsonl(line("a", "base"), line("b", "base:good"), line("c", "base:large")))
    with pytest.raises(JobSpecError, match=r"line 3: invalid_value \(body.model\): adapter large: r=64") as refused:
        check_jsonl(str(source))
    assert refused.value.field == "input"
    source.write_bytes(jsonl(line("a", "base"), line("b", "base:good")))
    batch = check_jsonl(str(source))
    assert isinstance(batch, BatchRequests) and batch.row_adapters == [None, locations["good"]]


def test_served_adapters_read_the_registry_of_this_host(deployment):
    env, locations = deployment
    adapters = served_adapters(Settings.from_env(env), env)
    assert adapters.locations == locations
    assert adapters.location(LineModel("base", "good")) == locations["good"]
