"""Everything the job page shows, gathered in one dict: summary, redacted spec, the
progress charts, shards, failed rows, webhook events with their attempts, the FP8
check and the usage and cost report (jobs.report)."""

from __future__ import annotations

import logging
import os
import time

from api.dashboard.chart import line_chart, per_bucket
from api.dashboard.reads import DashboardReads, shard_counts
from jobs.report import format_quant_check, job_report
from storage.manifest import read_errors
from storage.redaction import redact_text, redact_value

log = logging.getLogger("barge.api")

FAILED_ROWS_SAMPLE = 20
PRICE_ENV = "BARGE_PRICE_PER_HOUR"


def job_page(reads: DashboardReads, job_id: str) -> dict:
    from jobs.unserved import unserved_jobs
    summary = reads.job_summary(job_id)
    shards = reads.shards(job_id)
    points, bucket_s = per_bucket(reads.commits(job_id))
    times = [p.t for p in points]
    webhooks = reads.webhooks(job_id)
    # nothing more will change: the page stops polling (errors.jsonl is not re-read every 2 s)
    is_settled = summary["is_finished"] and all(event["status"] != "pending" for event in webhooks)
    return {"job": summary, "is_settled": is_settled, "spec": reads.spec(job_id), "shards": shards,
            "shard_counts": shard_counts(shards),
            "bucket_s": bucket_s, "points": [p.__dict__ for p in points],
            "charts": [line_chart("rows/s", times, [p.rows_per_s for p in points], "rows", clock),
                       line_chart("tokens/s", times, [p.tokens_per_s for p in points], "tokens", clock)],
            "webhooks": webhooks, "failed_rows": failed_rows(reads, summary),
            "report": usage_report(reads, job_id),
            "unserved": [u.describe() for u in unserved_jobs(reads.store.engine, job_ids=[job_id])]}


def failed_rows(reads: DashboardReads, summary: dict) -> dict:
    """A sample of OUTPUT/errors.jsonl, once the job's output (complete or partial) is
    written; while it runs, the failed-row count from the shards that committed."""
    sample = {"rows": [], "note": None, "num_failed": summary["rows_failed"]}
    if not summary["is_finished"]:
        sample["note"] = "errors.jsonl is written when the job finishes"
        return sample
    output = reads.store.get_job(summary["id"]).spec.output
    try:
        rows = read_errors(output, partial=True)
    except Exception as error:   # noqa: BLE001 - a sample only: any backend's error (botocore's
        # NoCredentialsError is no OSError: the server may hold no credentials for the output) is a note
        sample["note"] = f"no errors file to read: {redact_text(f'{type(error).__name__}: {error}')}"
        return sample
    sample["rows"] = [{"id": redact_value(row.get("id")), "error": redact_text(str(row.get("error")))}
                      for row in rows[:FAILED_ROWS_SAMPLE]]
    sample["num_failed"] = len(rows)
    return sample


def usage_report(reads: DashboardReads, job_id: str) -> dict:
    """jobs.report's figures: tokens, worker time by device, engines, a generate job's prefill
    and adapters, FP8 check, cost at BARGE_PRICE_PER_HOUR (when the server has one)."""
    price = os.environ.get(PRICE_ENV)
    try:
        found = job_report(reads.store, job_id, price_per_hour=float(price) if price else None)
    except ValueError:
        found = job_report(reads.store, job_id)
    report = found.to_dict()
    # a generate job's prefill and rows per adapter, as `barge report` words them
    report["generate_lines"] = [line.strip() for line in found.generate.format_lines()] if found.generate else []
    check = report.get("quant_check")
    report["quant_check_line"] = None if check is None else format_quant_check(check)
    report["price_env"] = PRICE_ENV
    report.pop("input", None)   # planning's findings: ids, not needed here
    return redact_value(report)


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))
