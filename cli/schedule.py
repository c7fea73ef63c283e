"""`barge schedule …` and `barge beat`.

    barge schedule add NAME --cron "0 2 * * *" --timezone Europe/Paris --catchup latest \\
        --retention-days 30 --mode embed --model minilm --incremental \\
        --input 's3://corpus/{date:%Y-%m-%d}/*.parquet' --output 's3://out/{date:%Y-%m-%d}/'
    barge schedule add NAME --cron ... --template job.json      (JobSpec fields as JSON)
    barge schedule list | runs NAME | pause NAME | resume NAME | run-now NAME | remove NAME
    barge schedule prune [NAME] [--dry-run]    remove outputs and cache entries past retention
    barge beat [--interval SECONDS] [--once]   fire due schedules (run one or several)
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone

from jobs.schedules import CATCHUP, Schedule
from storage.redaction import redact_text

DAY_S = 86_400.0


def add_commands(commands: argparse._SubParsersAction) -> None:
    schedule = commands.add_parser("schedule", help="recurring jobs: add, list, pause, resume, run-now, remove, prune")
    actions = schedule.add_subparsers(required=True, metavar="ACTION")
    _add_parser(actions)
    actions.add_parser("list", help="list schedules").set_defaults(func=_list)
    for name, func, help_text in (("runs", _runs, "a schedule's runs: period, job, status"),
                                  ("pause", _pause, "stop firing until resumed"),
                                  ("resume", _resume, "fire again, from the next period on"),
                                  ("run-now", _run_now, "submit the schedule's job now"),
                                  ("remove", _remove, "delete the schedule (its jobs and outputs stay)")):
        action = actions.add_parser(name, help=help_text)
        action.add_argument("name")
        action.set_defaults(func=func)
    prune = actions.add_parser("prune", help="remove outputs and cache entries older than a schedule's retention")
    prune.add_argument("name", nargs="?", help="one schedule (default: all)")
    prune.add_argument("--dry-run", action="store_true", help="print what would go, remove nothing")
    prune.set_defaults(func=_prune)

    beat = commands.add_parser("beat", help="fire due schedules (several beats may run: one job per period)")
    beat.add_argument("--interval", type=float, default=5.0, metavar="SECONDS")
    beat.add_argument("--once", action="store_true", help="one tick, then exit")
    beat.add_argument("--loglevel", default="INFO")
    beat.set_defaults(func=_beat)


def _add_parser(actions) -> None:
    add = actions.add_parser("add", help="add a schedule")
    add.add_argument("name")
    add.add_argument("--cron", required=True, help='five fields, e.g. "0 2 * * *" (02:00 every day)')
    add.add_argument("--timezone", default="UTC", help="IANA zone the cron and {date} are read in")
    add.add_argument("--catchup", default="latest", choices=CATCHUP,
                     help="periods missed while no beat ran: skip them, run the latest, or run all")
    add.add_argument("--retention-days", type=float, help="prune outputs and cache entries older than this")
    add.add_argument("--template", help="JSON file of JobSpec fields (the flags below override it)")
    add.add_argument("--mode")
    add.add_argument("--model")
    add.add_argument("--input", action="append", help="may contain {date:%%Y-%%m-%%d} or {prev_date:...}")
    add.add_argument("--output", help="may contain {date:%%Y-%%m-%%d} or {prev_date:...}")
    add.add_argument("--input-column")
    add.add_argument("--id-column")
    add.add_argument("--webhook-url")
    add.add_argument("--param", action="append", default=[], metavar="NAME=JSON")
    add.add_argument("--if-exists", choices=["error", "replace"])
    add.add_argument("--incremental", action="store_true", help="reuse cached results of unchanged rows")
    add.set_defaults(func=_add)


def _template(args) -> dict:
    template = json.loads(open(args.template).read()) if args.template else {}
    for name in ("mode", "model", "output", "input_column", "id_column", "webhook_url", "if_exists"):
        if getattr(args, name) is not None:
            template[name] = getattr(args, name)
    if args.input:
        template["input"] = args.input if len(args.input) > 1 else args.input[0]
    if args.param:
        template["params"] = {**template.get("params", {}), **_params(args.param)}
    if args.incremental:
        template["incremental"] = True
    return template


def _params(items: list[str]) -> dict:
    params = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--param {item!r} is not NAME=JSON")
        params[name] = json.loads(value)
    return params


def _add(args) -> int:
    retention_s = args.retention_days * DAY_S if args.retention_days is not None else None
    schedule = _client().schedules.add(args.name, cron=args.cron, template=_template(args), timezone=args.timezone,
                                       catchup=args.catchup, retention_s=retention_s)
    print(f"schedule {schedule.name} added; next run {_when(schedule.next_run_at, schedule)}")
    if schedule.webhook_secret:
        print(f"webhook secret for every run (shown once): {schedule.webhook_secret}")
    return 0


def _list(args) -> int:
    print(f"{'NAME':24}  {'CRON':16}  {'TIMEZONE':16}  {'STATE':7}  {'CATCHUP':7}  {'RETENTION':>9}  NEXT RUN")
    for s in _client().schedules.list():
        retention = "-" if s.retention_s is None else f"{s.retention_s / DAY_S:g}d"
        state = "enabled" if s.is_enabled else "paused"
        print(f"{s.name:24}  {s.cron:16}  {s.timezone:16}  {state:7}  {s.catchup:7}  {retention:>9}  "
              f"{_when(s.next_run_at, s) if s.is_enabled else '-'}")
    return 0


def _runs(args) -> int:
    client = _client()
    schedule = client.schedules.get(args.name)
    for run in client.schedules.runs(args.name):
        pruned = " (output pruned)" if run.pruned_at else ""
        print(f"{_when(run.period_at, schedule)}  {run.kind:9}  {run.status:9}  job {run.job_id}{pruned}"
              + (f"  {redact_text(run.error)}" if run.error else ""))
    return 0


def _pause(args) -> int:
    _client().schedules.pause(args.name)
    print(f"schedule {args.name} paused")
    return 0


def _resume(args) -> int:
    schedule = _client().schedules.resume(args.name)
    print(f"schedule {args.name} resumed; next run {_when(schedule.next_run_at, schedule)}")
    return 0


def _run_now(args) -> int:
    job = _client().schedules.run_now(args.name)
    print(f"job {job.id} queued")
    return 0


def _remove(args) -> int:
    _client().schedules.remove(args.name)
    print(f"schedule {args.name} removed (its jobs and outputs stay)")
    return 0


def _prune(args) -> int:
    for line in _client().schedules.prune(args.name, dry_run=args.dry_run).lines():
        print(line)
    return 0


def _beat(args) -> int:
    from jobs.beat import Beat, clock_from_env
    from jobs.logs import configure_logging   # the worker's handler: every line through storage.redaction
    configure_logging(args.loglevel)
    client = _client()
    check_templates(client)
    beat = Beat(client, clock_from_env(), interval_s=args.interval)
    if args.once:
        result = beat.tick()
        print(f"{result.runs_created} runs planned, {result.submitted} submitted, {result.refused} refused, "
              f"{result.periods_skipped} missed periods skipped")
        return 0
    try:
        beat.run_forever()
    except KeyboardInterrupt:
        beat.stop()
    return 0


def check_templates(client) -> None:
    """Many hosts: `barge beat` refuses to start while an enabled schedule's template names a
    location the workers cannot reach (one added before the deployment grew, or on one host),
    naming the schedule and the field, rather than have every run refused at its submit."""
    from jobs.hosts import template_problem
    for schedule in client.schedules.list():
        if schedule.is_enabled and (problem := template_problem(schedule.template, client.settings)) is not None:
            field, why = problem
            raise ValueError(f"schedule {schedule.name!r}: {field}: {why}; pause it (barge schedule pause "
                             f"{schedule.name}) or remove it and add it again with shared locations")


def _when(epoch: float, schedule: Schedule) -> str:
    from jobs.schedules import zone
    return datetime.fromtimestamp(epoch, timezone.utc).astimezone(zone(schedule.timezone)).isoformat(timespec="minutes")


def _client():
    from jobs.client import Client
    return Client()
