"""Cross-encoder throughput: Barge's Classifier.score_pairs beside sentence-transformers'
CrossEncoder.predict on the same (query, document) pairs, same process, same threads,
same weights (fp32, CPU).

    .venv/bin/python bench/cross_encoder_bench.py                            # 2,000 pairs, 3 repeats
    .venv/bin/python bench/cross_encoder_bench.py --num-pairs 500 --repeats 1
    .venv/bin/python bench/cross_encoder_bench.py --dtype bfloat16            # both sides in bf16 (AMX)

The model is the real all-MiniLM-L6-v2 encoder and pooler under a seeded one-label
classifier (tests/support/random_classifiers.py): the shape of
cross-encoder/ms-marco-MiniLM-L6-v2, whose weights do not install offline here; the speed
does not depend on the classifier's values. Pairs: queries of 4-12 words, passages of
20-150 words (log-uniform) from the licence texts every Debian machine has.

CrossEncoder.predict runs at its best batch size, found by a sweep on the first pairs;
then the two take turns to go first, --repeats times. Prints pairs/s of each (median), the
ratio, the largest score difference, and the CPU model. With --dtype bfloat16 both load
the weights in bf16 (oneDNN's AMX kernels on a CPU that has them, on either side).
"""

from __future__ import annotations

import argparse
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
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # the repo root, for tests.support

import numpy as np  # noqa: E402
import torch  # noqa: E402

from engine.score.classifier import Classifier  # noqa: E402
from engine.score.params import ScoreParams  # noqa: E402
from machine import cpu_model  # noqa: E402 - bench/machine.py
from tests.support.random_classifiers import save_minilm_cross_encoder  # noqa: E402

NOT_PROSE = re.compile(r"@|https?:|www\.|/|\d{4}")
BATCH_SIZES = (16, 32, 64, 128)
MAX_BATCH_TOKENS = 2048     # Barge's CPU default (engine.engine.DEFAULT_MAX_BATCH_TOKENS)


def build_pairs(num_pairs: int, seed: int = 0) -> tuple[list[str], list[str]]:
    words = [word for path in sorted(Path("/usr/share/common-licenses").glob("*")) if path.is_file()
             for line in path.read_text(errors="ignore").splitlines() if not NOT_PROSE.search(line)
             for word in line.split() if len(word) <= 20]
    rng = random.Random(seed)

    def passage(low: int, high: int) -> str:
        length = round(math.exp(rng.uniform(math.log(low), math.log(high))))
        start = rng.randrange(len(words) - length)
        return " ".join(words[start:start + length])

    pairs = [(passage(4, 12), passage(20, 150)) for _ in range(num_pairs)]
    return [query for query, _ in pairs], [document for _, document in pairs]


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def best_batch_size(reference, pairs: list[tuple[str, str]]) -> int:
    rates = {}
    for batch_size in BATCH_SIZES:
        seconds, _ = timed(lambda: reference.predict(pairs, batch_size=batch_size))
        rates[batch_size] = len(pairs) / seconds
        print(f"  CrossEncoder.predict batch {batch_size:>4}: {rates[batch_size]:7.1f} pairs/s (sweep)")
    return max(rates, key=rates.get)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-pairs", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sweep-pairs", type=int, default=256)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = parser.parse_args()
    from sentence_transformers import CrossEncoder

    queries, documents = build_pairs(args.num_pairs)
    pairs = list(zip(queries, documents))
    with tempfile.TemporaryDirectory() as folder:
        save_minilm_cross_encoder(Path(folder))
        dtype = getattr(torch, args.dtype)
        reference = CrossEncoder(folder, device="cpu", model_kwargs={"dtype": dtype})
        barge = Classifier.load(folder, dtype, torch.device("cpu"), MAX_BATCH_TOKENS)
    num_tokens = sum(output.num_tokens for output in barge.score_pairs(queries[:256], documents[:256], ScoreParams()))
    print(f"{args.num_pairs} pairs (first 256: {num_tokens / 256:.0f} tokens a pair), {args.dtype}, "
          f"{torch.get_num_threads()} threads, CPU: {cpu_model()}")
    batch_size = best_batch_size(reference, pairs[:args.sweep_pairs])
    seconds: dict[str, list[float]] = {"barge": [], "sentence-transformers": []}
    runs = {"barge": lambda: [output.score for output in barge.score_pairs(queries, documents, ScoreParams())],
            "sentence-transformers": lambda: reference.predict(pairs, batch_size=batch_size)}
    scores = {}
    for repeat in range(args.repeats):
        for name in sorted(runs, reverse=repeat % 2 == 1):
            elapsed, scores[name] = timed(runs[name])
            seconds[name].append(elapsed)
        print(f"  repeat {repeat + 1}: barge {seconds['barge'][-1]:.2f} s, "
              f"sentence-transformers {seconds['sentence-transformers'][-1]:.2f} s")
    rates = {name: args.num_pairs / statistics.median(values) for name, values in seconds.items()}
    difference = float(np.abs(np.array(scores["barge"]) - np.array(scores["sentence-transformers"])).max())
    print(f"barge:                 {rates['barge']:8.1f} pairs/s (max_batch_tokens {MAX_BATCH_TOKENS})")
    print(f"sentence-transformers: {rates['sentence-transformers']:8.1f} pairs/s (batch_size {batch_size})")
    print(f"ratio barge / sentence-transformers: {rates['barge'] / rates['sentence-transformers']:.2f}x "
          f"(median of {args.repeats}); max score difference {difference:.2e}")


if __name__ == "__main__":
    main()
