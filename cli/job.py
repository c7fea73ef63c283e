"""`barge submit` and the commands that follow a job: status, wait, cancel, retry,
results, report, jobs.

    barge submit --mode embed --model minilm --input 'corpus/*.parquet' --output out/
    barge submit --mode score --model reranker --param query_column=q --param document_column=d ...
    barge submit --mode generate --model smollm2 --adapter adapters/support/ ...   (or --param adapter_column=COL)
    barge status JOB | wait JOB | cancel JOB | retry JOB | results JOB | report JOB | jobs
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap

from jobs.client import Client
from jobs.records import JobProgress
from jobs.spec import JobSpec, JobSpecError
from jobs.status import JobStatus
from jobs.throughput import format_duration, format_rate
from storage.redaction import redact_text, redact_url

JOBS_PER_PAGE = 20   # `barge jobs` without --limit


def add_commands(commands: argparse._SubParsersAction) -> None:
    submit = commands.add_parser("submit", help="validate and queue a job")
    submit.add_argument("--mode", default="embed", help="embed (the default), generate, transcribe, classify or score")
    submit.add_argument("--model", help="registered model name, model folder or Hub id org/name[@revision][:quant] "
                                        "(an OpenAI batch file names its own)")
    submit.add_argument("--input", required=True, action="append", help="Parquet path, URL, glob or folder (repeatable),"
                                                                        " or an OpenAI batch file (.jsonl)")
    submit.add_argument("--format", choices=["parquet", "openai"],
                        help="the input's format; default: openai for one .jsonl file, else parquet")
    submit.add_argument("--output", required=True)
    submit.add_argument("--input-column", default="text")
    submit.add_argument("--id-column")
    submit.add_argument("--webhook-url")
    submit.add_argument("--webhook-event", action="append", default=[], dest="webhook_events",
                        help="opt-in event: job.progress, shard.completed or job.stalled (repeatable)")
    submit.add_argument("--expires-after", type=float, metavar="SECONDS", help="expire the job if unfinished by then")
    submit.add_argument("--param", action="append", default=[], metavar="NAME=JSON",
                        help="e.g. dimensions=256, query_column=q (a value that is not JSON is a string)")
    submit.add_argument("--metadata", default="{}", help="JSON object echoed in status and webhooks")
    submit.add_argument("--if-exists", default="error", choices=["error", "replace"])
    submit.add_argument("--max-rows-per-shard", type=int, default=2048)
    submit.add_argument("--priority", type=int, default=5, help="0 (lowest) to 9 (highest)")
    submit.add_argument("--incremental", action="store_true",
                        help="reuse results cached by earlier jobs for unchanged input values")
    submit.add_argument("--quantization", choices=["fp8", "fp8-block", "fp8-group"],
                        help="run the model's linear layers with FP8 weights")
    submit.add_argument("--quant-check-rows", type=int, default=0, metavar="N",
                        help="with --quantization: compare FP8 with the unquantized model on shard 0's first N rows")
    submit.add_argument("--kv-cache-dtype", choices=["auto", "fp8"],
                        help="generate: fp8 caches K/V in E4M3, about twice the sequences at once (GPU: capability 8.9+)")
    submit.add_argument("--adapter", metavar="PATH",
                        help="generate: a PEFT LoRA adapter (folder or URL) for every row; "
                             "per row: --param adapter_column=COL")
    submit.add_argument("--allow-duplicate-ids", action="store_true",
                        help="run the job even if its id column repeats ids (refused by default)")
    submit.add_argument("--dry-run", action="store_true",
                        help="check the job and show the input layout planning finds; queue nothing")
    submit.add_argument("--wait", action="store_true", help="wait with a progress bar")
    submit.set_defaults(func=_submit)

    for name, func, help_text in (("status", _status, "show a job's progress"),
                                  ("wait", _wait, "wait for a job to finish"),
                                  ("cancel", _cancel, "cancel a job"),
                                  ("retry", _retry, "re-run the failed or cancelled shards of a finished job"),
                                  ("results", _results, "print or save a finished job's results")):
        command = commands.add_parser(name, help=help_text)
        command.add_argument("job_id")
        command.set_defaults(func=func)
        if name == "wait":
            command.add_argument("--timeout", type=float)
            command.add_argument("--no-progress", action="store_true")
        if name == "results":
            command.add_argument("--limit", type=int, default=10, help="rows to print")
            command.add_argument("--save", help="write the whole result to this Parquet file")
            command.add_argument("--partial", action="store_true",
                                 help="an expired, cancelled or failed job: the rows it finished")

    report = commands.add_parser("report", help="a job's engine, throughput, worker time and cost")
    report.add_argument("job_id")
    report.add_argument("--price-per-hour", type=float, metavar="PRICE",
                        help="price of one worker-hour (GPU-hour); default BARGE_PRICE_PER_HOUR")
    report.add_argument("--json", action="store_true", help="print the report as JSON")
    report.set_defaults(func=_report)

    listing = commands.add_parser("jobs", help="list jobs, newest first, a page at a time")
    listing.add_argument("--limit", type=int, default=JOBS_PER_PAGE, help=f"jobs per page (default {JOBS_PER_PAGE})")
    listing.add_argument("--before", metavar="JOB_ID", help="the page after this job (the last line names it)")
    listing.add_argument("--status", choices=[str(s) for s in JobStatus], help="only jobs in this state")
    listing.set_defaults(func=_jobs)


def _submit(args) -> int:
    from api.local_batch import is_openai_input
    if is_openai_input(args.input, args.format):
        return _submit_openai(args)
    if args.dry_run:
        from jobs.dry_run import dry_run
        print(dry_run(submitted_spec(args), Client().resolve_model).describe())
        return 0
    job = Client().submit(submitted_spec(args))
    print(f"job {job.id} queued")
    if job.webhook_secret:
        print(f"webhook secret (shown once): {job.webhook_secret}")
    if args.wait:
        _print_status(job.wait(progress=True))
    return 0


def _submit_openai(args) -> int:
    """An OpenAI batch file: the same checks as the API's, then output.jsonl in the output folder."""
    from api.local_batch import OUTPUT_NAME, check_jsonl, describe_requests, submit_jsonl, write_jsonl_output
    if args.dry_run:
        print(describe_requests(check_jsonl(args.input[0])))
        return 0
    job = submit_jsonl(Client(), args.input[0], args.output, if_exists=args.if_exists,
                       max_rows_per_shard=args.max_rows_per_shard, priority=args.priority,
                       expires_after_s=args.expires_after, webhook_url=args.webhook_url)
    print(f"job {job.id} queued")
    if job.webhook_secret:
        print(f"webhook secret (shown once): {job.webhook_secret}")
    if not args.wait:
        return 0
    state = job.wait(progress=True)
    _print_status(state)
    made = write_jsonl_output(job)
    print(f"  {OUTPUT_NAME}: {made.num_completed} requests succeeded, {made.num_failed} failed")
    return 0 if state.status.name == "SUCCEEDED" else 1


def submitted_spec(args) -> JobSpec:
    """`barge submit`'s options as a JobSpec (validated as any other)."""
    params = {}
    for item in args.param:
        name, sep, value = item.partition("=")
        if not sep:
            raise JobSpecError("params", f"{item!r} is not NAME=JSON")
        params[name] = param_value(value)
    return JobSpec(mode=args.mode, model=args.model, input=args.input if len(args.input) > 1 else args.input[0],
                   output=args.output, input_column=args.input_column, id_column=args.id_column,
                   webhook_url=args.webhook_url, params=params, metadata=json.loads(args.metadata),
                   if_exists=args.if_exists, max_rows_per_shard=args.max_rows_per_shard, priority=args.priority,
                   webhook_events=tuple(args.webhook_events), expires_after_s=args.expires_after,
                   incremental=args.incremental, quantization=args.quantization,
                   quant_check_rows=args.quant_check_rows, kv_cache_dtype=args.kv_cache_dtype,
                   allow_duplicate_ids=args.allow_duplicate_ids, adapter=args.adapter)


def param_value(value: str) -> object:
    """A --param value: JSON (256, true, null, "q", [1, 2]), else the text as given
    (query_column=q is "q", as query_column='"q"' is)."""
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _status(args) -> int:
    from jobs.planned import audio_progress, planned_layout
    from jobs.unserved import unserved_jobs
    client = Client()
    state = client.job(args.job_id).status()
    _print_status(state)
    for unserved in unserved_jobs(client.store.engine, job_ids=[args.job_id]):
        print(f"  {unserved.describe()}")
    shards = client.store.list_shards(args.job_id)
    audio = audio_progress(shards, state)
    if audio is not None:
        print(f"  {audio.describe()}")
    layout = planned_layout(shards)
    if layout is not None:
        print("  plan:\n" + textwrap.indent(layout.describe(), "    "))
    return 0


def _wait(args) -> int:
    state = Client().job(args.job_id).wait(args.timeout, progress=not args.no_progress)
    _print_status(state)
    return 0 if state.status.name == "SUCCEEDED" else 1


def _cancel(args) -> int:
    cancelled = Client().job(args.job_id).cancel()
    print("cancelled" if cancelled else "already finished")
    return 0 if cancelled else 1


def _retry(args) -> int:
    client = Client()
    try:
        job = client.retry(args.job_id)
    except ValueError as exc:
        print(f"barge: {exc}", file=sys.stderr)
        return 1
    print(f"job {job.id} re-opened: {job.status().status}")
    return 0


def _results(args) -> int:
    table = Client().job(args.job_id).results(partial=args.partial)
    if args.save:
        import pyarrow.parquet as pq
        pq.write_table(table, args.save)
        print(f"{table.num_rows} rows written to {args.save}")
    else:
        print(table.slice(0, args.limit).to_pandas() if _has_pandas() else table.slice(0, args.limit))
        print(f"({table.num_rows} rows)")
    return 0


def _report(args) -> int:
    from jobs.report import format_report, job_report
    client = Client()
    client.job(args.job_id)   # KeyError for an unknown id
    price = args.price_per_hour if args.price_per_hour is not None else client.settings.price_per_hour
    report = job_report(client.store, args.job_id, price_per_hour=price)
    print(json.dumps(report.to_dict(), indent=2) if args.json else format_report(report))
    return 0


def _jobs(args) -> int:
    status = JobStatus[args.status.upper()] if args.status else None
    page = Client().job_page(args.limit, before=args.before, status=status)
    print(f"{'JOB':32}  {'STATUS':10}  {'DONE':>9}  {'FAILED':>7}  {'TOTAL':>9}  {'ROWS/S':>8}  {'ETA':>6}  OUTPUT")
    for state in page.jobs:
        t = state.throughput
        rate = (t.recent_rows_per_s or t.rows_per_s) if t else None
        eta = "" if state.is_finished or t is None else format_duration(t.eta_s)
        print(f"{state.job_id:32}  {str(state.status):10}  {state.rows_done:>9}  {state.rows_failed:>7}  "
              f"{state.rows_total:>9}  {'-' if rate is None else f'{rate:,.1f}':>8}  {eta:>6}  {redact_url(state.output)}")
    if page.next_before is not None:
        print(f"older jobs: {_next_page_command(args, page.next_before)}")
    return 0


def _next_page_command(args, cursor: str) -> str:
    """The `barge jobs` that lists the next page with the same options."""
    options = "" if args.limit == JOBS_PER_PAGE else f" --limit {args.limit}"
    options += f" --status {args.status}" if args.status else ""
    return f"barge jobs{options} --before {cursor}"


def _print_status(state: JobProgress) -> None:
    shards = ", ".join(f"{count} {name}" for name, count in sorted(state.shards.items())) or "none yet"
    print(f"job {state.job_id}: {state.status}")
    print(f"  rows: {state.rows_done} done of {state.rows_total} ({state.rows_succeeded} succeeded, "
          f"{state.rows_failed} failed)")
    if state.rows_reused:
        print(f"  incremental: {state.rows_computed} rows computed, {state.rows_reused} reused from the cache")
    print(f"  shards: {shards}")
    t = state.throughput
    if t is not None:
        print(f"  tokens: {state.num_tokens}")
        print(f"  rate: {format_rate(t.recent_rows_per_s, 'rows')}, {format_rate(t.recent_tokens_per_s, 'tokens')} "
              f"over the last {format_duration(min(t.window_s, t.running_s))}; "
              f"{format_rate(t.rows_per_s, 'rows')}, {format_rate(t.tokens_per_s, 'tokens')} overall")
        eta = "" if state.is_finished else f"; ETA {format_duration(t.eta_s)}"
        print(f"  time: {format_duration(t.queued_s)} queued, {format_duration(t.running_s)} running{eta}")
    print(f"  output: {redact_url(state.output)}")
    if state.error:
        print(f"  error: {redact_text(state.error)}")


def _has_pandas() -> bool:
    try:
        import pandas  # noqa: F401
    except ImportError:
        return False
    return True

