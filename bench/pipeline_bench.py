"""Whole embed jobs through a real worker, with and without the shard pipeline.

    python bench/pipeline_bench.py --num-sentences 4000 --shard-rows 256 --repeats 3

The same job (all-MiniLM-L6-v2, the embedded default: client → broker → worker
process → Parquet) runs with BARGE_PIPELINE_DEPTH=0 (each shard claimed, read, computed,
written and committed before the next message is taken) and =1 (the next shard read
while the engine computes, engine calls topped up across shard boundaries, commits on
their own thread), interleaved, and the medians are compared. Small shards make the
gaps between shards, which the pipeline fills, a larger share of the job.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.embed_bench import build_corpus, run_job  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-sentences", type=int, default=4000)
    parser.add_argument("--shard-rows", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sentences = build_corpus(args.num_sentences)
    seconds: dict[int, list[float]] = {0: [], 1: []}
    for repeat in range(args.repeats):
        for depth in (0, 1):
            with tempfile.TemporaryDirectory(prefix="barge-bench-") as workdir:
                env = {"BARGE_PIPELINE_DEPTH": str(depth)}
                seconds[depth].append(run_job(sentences, Path(workdir), env=env, shard_rows=args.shard_rows))
        print(f"  repeat {repeat + 1}: depth 0 {seconds[0][-1]:.2f} s, depth 1 {seconds[1][-1]:.2f} s")
    rates = {depth: len(sentences) / statistics.median(s) for depth, s in seconds.items()}
    print(f"{len(sentences)} rows in shards of {args.shard_rows}: without pipeline {rates[0]:.1f} rows/s, "
          f"with pipeline {rates[1]:.1f} rows/s (medians of {args.repeats}): ratio {rates[1] / rates[0]:.2f}x")


if __name__ == "__main__":
    main()
