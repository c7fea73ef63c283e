"""A job's report: what ran it, how fast, how much worker time by device, and what it
cost at a price per worker-hour — in the manifest's stats and through `barge report`. A
generate job's adds its prefill against the prefix cache and, with LoRA adapters, its rows
and tokens per adapter (jobs.generate_usage).

The price is per hour of one worker (on a GPU worker, its GPU-hour): set it with
BARGE_PRICE_PER_HOUR or `barge report --price-per-hour`, then compare the cost per
million tokens with a per-token API.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.generate_usage import GenerateUsage, sum_usage
from jobs.store import Store
from jobs.throughput import Throughput, format_duration, format_rate


@dataclass(frozen=True)
class Cost:
    price_per_hour: float
    worker_hours: float
    total: float
    per_million_tokens: float | None    # None: the job processed no tokens

    def to_dict(self) -> dict:
        return {"price_per_hour": self.price_per_hour, "worker_hours": round(self.worker_hours, 6),
                "total": round(self.total, 6),
                "per_million_tokens": None if self.per_million_tokens is None else round(self.per_million_tokens, 6)}


@dataclass(frozen=True)
class JobReport:
    job_id: str
    status: str
    mode: str
    model: str
    rows_total: int
    rows_succeeded: int
    rows_failed: int
    rows_reused: int                     # incremental jobs: succeeded rows taken from the results cache
    num_tokens: int
    num_shards: int
    engines: list[dict]                  # distinct engine settings of the workers that committed shards
    throughput: Throughput
    worker_s_by_device: dict[str, float]  # device type (cpu | cuda | ...) -> seconds
    cost: Cost | None                    # None: no price given
    quant_check: dict | None = None      # FP8 jobs with quant_check_rows: engine.quant.compare.QuantCheck's
                                         # figures, or {"error": ...} when the check could not run
    input: dict | None = None            # what planning found: duplicate and null ids, staging (queueing.planning)
    generate: GenerateUsage | None = None  # generate jobs: prefill and rows per adapter over the committed shards
                                           # that recorded them; None: other modes, or no such shard yet

    def to_dict(self) -> dict:
        return {"job_id": self.job_id, "status": self.status, "mode": self.mode, "model": self.model,
                "rows_total": self.rows_total, "rows_succeeded": self.rows_succeeded,
                "rows_failed": self.rows_failed, "rows_reused": self.rows_reused,
                "rows_computed": self.rows_succeeded + self.rows_failed - self.rows_reused, "num_tokens": self.num_tokens, "num_shards": self.num_shards,
                "engines": self.engines, "throughput": self.throughput.to_dict(),
                "worker_seconds": {device: round(s, 3) for device, s in self.worker_s_by_device.items()},
                "cost": None if self.cost is None else self.cost.to_dict(),
                **({"quant_check": self.quant_check} if self.quant_check is not None else {}),
                **({"input": self.input} if self.input is not None else {}),
                **(self.generate.to_report() if self.generate is not None else {})}


def job_report(store: Store, job_id: str, *, price_per_hour: float | None = None) -> JobReport:
    job = store.get_job(job_id)
    progress = store.progress(job_id)
    by_device = store.device_seconds(job_id)
    return JobReport(job_id=job_id, status=str(progress.status), mode=job.spec.mode, model=job.spec.model,
                     rows_total=progress.rows_total, rows_succeeded=progress.rows_succeeded,
                     rows_failed=progress.rows_failed, rows_reused=progress.rows_reused, num_tokens=progress.num_tokens,
                     num_shards=sum(progress.shards.values()), engines=store.engine_settings(job_id),
                     throughput=progress.throughput, worker_s_by_device=by_device,
                     cost=cost(sum(by_device.values()), progress.num_tokens, price_per_hour),
                     quant_check=store.quant_check(job_id), input=_planned_input(store, job_id),
                     generate=sum_usage(store.generate_usages(job_id)) if job.spec.mode == "generate" else None)


def _planned_input(store: Store, job_id: str) -> dict | None:
    """Planning records its findings with the first shard (queueing.planning.input_summary)."""
    first = next(iter(store.list_shards(job_id)), None)
    return None if first is None else first.plan.get("input")


def cost(worker_s: float, num_tokens: int, price_per_hour: float | None) -> Cost | None:
    if price_per_hour is None:
        return None
    worker_hours = worker_s / 3600
    total = worker_hours * price_per_hour
    return Cost(price_per_hour=price_per_hour, worker_hours=worker_hours, total=total,
                per_million_tokens=total / num_tokens * 1e6 if num_tokens else None)


def format_report(report: JobReport) -> str:
    t = report.throughput
    lines = [f"job {report.job_id}: {report.status} ({report.mode}, model {report.model})",
             f"  rows: {report.rows_succeeded + report.rows_failed} of {report.rows_total} "
             f"({report.rows_succeeded} succeeded, {report.rows_failed} failed) in {report.num_shards} shards",
             *([f"  incremental: {report.rows_succeeded + report.rows_failed - report.rows_reused} rows computed, "
                f"{report.rows_reused} reused from the results cache"] if report.rows_reused else []),
             f"  tokens: {report.num_tokens}",
             f"  throughput: {format_rate(t.rows_per_s, 'rows')}, {format_rate(t.tokens_per_s, 'tokens')} overall",
             f"  time: {format_duration(t.queued_s)} queued, {format_duration(t.running_s)} running, "
             f"{format_duration(t.worker_s)} of worker time"]
    if report.generate is not None:
        lines.extend(report.generate.format_lines())
    devices = ", ".join(f"{device} {seconds:.1f}s" for device, seconds in sorted(report.worker_s_by_device.items()))
    lines.append(f"  worker seconds by device: {devices or 'none yet'}")
    for settings in report.engines:
        lines.append("  engine: " + ", ".join(f"{name}={value}" for name, value in settings.items()))
    if report.quant_check is not None:
        lines.append("  FP8 check: " + format_quant_check(report.quant_check))
    if report.cost is None:
        lines.append("  cost: set BARGE_PRICE_PER_HOUR or --price-per-hour")
    else:
        c = report.cost
        per_million = "-" if c.per_million_tokens is None else f"{c.per_million_tokens:.4f}"
        lines.append(f"  cost: {c.total:.4f} for {c.worker_hours:.4f} worker-hours at {c.price_per_hour:g}/hour; "
                     f"{per_million} per million tokens")
    return "\n".join(lines)


def format_quant_check(check: dict) -> str:
    """One line of a stored QuantCheck (engine.quant.compare; not imported: it loads torch)."""
    if "error" in check:
        return f"could not run: {check['error']}"
    head = f"{check['quantization']} vs {check['baseline_dtype']} on {check['num_rows']} rows of shard 0"
    # The recipe (scale method, what stays 16-bit), in checks recorded since issue 22.
    recipe = "".join(f"; {label} {check[key]}" for key, label in (("recipe", "recipe"), ("kept_16bit", "kept 16-bit"))
                     if key in check)
    if check["mode"] == "embed":
        return f"{head}: embedding cosine mean {check['cosine_mean']:.5f}, min {check['cosine_min']:.5f}{recipe}"
    if check["mode"] == "generate":
        return (f"{head}: greedy agreement {check['greedy_agreement']:.1%} of tokens "
                f"({check['greedy_exact']:.1%} of prompts identical); perplexity over {check['num_tokens']} "
                f"prompt tokens {check['perplexity_baseline']:.3f} -> {check['perplexity_fp8']:.3f}{recipe}")
    return (f"{head}: word error rate against the unquantized transcripts mean {check['wer_mean']:.2%}, "
            f"max {check['wer_max']:.2%}{recipe}")
