"""`barge webhooks …`: inspect the outbox, re-send an event, re-enable an endpoint.

    barge webhooks list [--job JOB] [--status pending|delivered|failed|disabled]
    barge webhooks show EVENT_ID          the event, its body and every attempt
    barge webhooks replay EVENT_ID        send it again now (same webhook-id)
    barge webhooks endpoints              URLs disabled after answering 410 Gone
    barge webhooks enable URL             re-enable one; its held events become due
    barge webhooks prune [--older-than 30d] [--dry-run]
                                          delete delivered and failed events (and their
                                          attempts) settled that long ago; pending never

Nothing here prints or logs a webhook secret: the outbox holds none, and replay reads
the job's secret only to sign. Everything shown goes through storage.redaction: a URL as
scheme://host/*** (a receiver's token sits in its path or query), the body's metadata
without values under secret names, errors with their URLs redacted. Replay still sends
to the whole URL.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import TextIO

from jobs.outbox import EVENT_STATUSES, RETENTION_ENV, parse_duration, retention_from_env
from jobs.records import WebhookRecord
from jobs.settings import Settings
from jobs.store import Store
from storage.redaction import redact_text, redact_url, redact_value

DEFAULT_RETENTION_S = 30 * 86_400.0   # what `prune` keeps when neither --older-than nor the environment says


def add_commands(commands: argparse._SubParsersAction) -> None:
    webhooks = commands.add_parser("webhooks", help="inspect, replay and re-enable webhooks")
    actions = webhooks.add_subparsers(required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="list webhook events, newest last")
    listing.add_argument("--job", help="only this job's events")
    listing.add_argument("--status", choices=EVENT_STATUSES)
    listing.add_argument("--limit", type=int, default=50)
    listing.set_defaults(func=lambda args: list_events(_store(), args.job, args.status, args.limit))
    show = actions.add_parser("show", help="an event, its body and every delivery attempt")
    show.add_argument("event_id")
    show.set_defaults(func=lambda args: show_event(_store(), args.event_id))
    replay = actions.add_parser("replay", help="send an event again now, with the same webhook-id")
    replay.add_argument("event_id")
    replay.set_defaults(func=lambda args: replay_event(_store(), args.event_id))
    endpoints = actions.add_parser("endpoints", help="endpoints disabled after 410 Gone")
    endpoints.set_defaults(func=lambda args: list_endpoints(_store()))
    enable = actions.add_parser("enable", help="re-enable a disabled endpoint URL")
    enable.add_argument("url")
    enable.set_defaults(func=lambda args: enable_endpoint(_store(), args.url))
    prune = actions.add_parser("prune", help="delete delivered and failed events settled long ago")
    prune.add_argument("--older-than", type=_duration_arg, default=None, metavar="AGE",
                       help=f"e.g. 30d, 12h, 90m, 3600s (default: {RETENTION_ENV}, else 30d)")
    prune.add_argument("--dry-run", action="store_true", help="count, delete nothing")
    prune.set_defaults(func=lambda args: prune_events(_store(), args.older_than, args.dry_run))
    rotate = actions.add_parser("rotate-secret", help="give a job a new webhook secret (printed once)")
    rotate.add_argument("job_id")
    rotate.add_argument("--overlap-hours", type=float, default=24.0,
                        help="how long deliveries are also signed with the old secret")
    rotate.set_defaults(func=lambda args: rotate_secret(args.job_id, args.overlap_hours * 3600))


def prune_events(store: Store, older_than_s: float | None, dry_run: bool, out: TextIO | None = None) -> int:
    if older_than_s is None:
        older_than_s = retention_from_env()
        older_than_s = DEFAULT_RETENTION_S if older_than_s is None else older_than_s
    pruned = store.outbox.prune(older_than_s, dry_run=dry_run)
    print(f"{'would delete' if dry_run else 'deleted'} {pruned.num_events} event(s) and {pruned.num_attempts} "
          f"attempt(s) delivered or failed before {_when(time.time() - older_than_s)}", file=out)
    return 0


def _duration_arg(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def rotate_secret(job_id: str, overlap_s: float, out: TextIO | None = None) -> int:
    from jobs.client import Client
    secret = Client().job(job_id).rotate_webhook_secret(overlap_s)
    print(f"new webhook secret for job {job_id} (shown once): {secret}", file=out)
    print(f"deliveries are signed with the old secret too for {overlap_s / 3600:g} hours", file=out)
    return 0


def _store() -> Store:
    store = Store(Settings.from_env().database_url)
    store.migrate()
    return store


def list_events(store: Store, job_id: str | None, status: str | None, limit: int, out: TextIO | None = None) -> int:
    events = store.outbox.events(job_id, status=status, limit=limit)
    print(f"{'EVENT':36}  {'TYPE':15}  {'STATUS':9}  {'TRIES':>5}  {'LAST':>4}  {'JOB':32}  NEXT", file=out)
    for event in events:
        next_at = _when(event.next_attempt_at) if event.status == "pending" else "-"
        print(f"{event.id:36}  {event.type:15}  {event.status:9}  {event.attempts:>5}  "
              f"{event.last_status_code or '-':>4}  {event.job_id:32}  {next_at}", file=out)
    return 0


def show_event(store: Store, event_id: str, out: TextIO | None = None) -> int:
    event = store.outbox.event(event_id)
    _print_event(event, out)
    body = redact_value(json.loads(event.body))
    print(f"  body: {json.dumps(body, indent=2, sort_keys=True)}", file=out)
    attempts = store.outbox.attempts(event_id)
    print(f"  attempts ({len(attempts)}):", file=out)
    for attempt in attempts:
        if attempt.finished_at is None:
            outcome = "no outcome recorded (the dispatcher stopped mid-attempt, or is still waiting)"
        else:
            outcome = f"HTTP {attempt.status_code}" if attempt.status_code else "no HTTP answer"
            outcome += f" in {attempt.latency_s:.3f}s"
            outcome += f": {redact_text(attempt.error)}" if attempt.error else ""
        print(f"    #{attempt.attempt}  {_when(attempt.started_at)}  {outcome}", file=out)
    return 0


def replay_event(store: Store, event_id: str, out: TextIO | None = None) -> int:
    from queueing.dispatch import deliver_event   # the sender lives with the dispatcher
    from webhooks.retry import RetryPolicy
    from webhooks.safety import allow_hosts_from_env

    event = store.outbox.event(event_id)
    if any(e.url == event.url and e.disabled_at for e in store.outbox.endpoints()):
        print(f"endpoint {redact_url(event.url)} is disabled (it answered 410 Gone); re-enable it first: "
              f"barge webhooks enable URL", file=out)
        return 1
    try:
        store.outbox.replay(event_id)
    except ValueError as exc:   # a dispatcher is sending it right now
        print(exc, file=out)
        return 1
    delivered = deliver_event(store, event_id, RetryPolicy.from_env(), allow_hosts=allow_hosts_from_env())
    event = store.outbox.event(event_id)
    if delivered:
        print(f"{event_id} delivered again (HTTP {event.last_status_code})", file=out)
        return 0
    print(f"{event_id} not delivered now ({redact_text(event.last_error or 'claimed by a dispatcher')}); "
          f"status {event.status}"
          + (f", next attempt {_when(event.next_attempt_at)}" if event.status == "pending" else ""), file=out)
    return 1


def list_endpoints(store: Store, out: TextIO | None = None) -> int:
    print(f"{'STATE':8}  {'SINCE':20}  {'URL':50}  REASON", file=out)
    for endpoint in store.outbox.endpoints():
        state = "disabled" if endpoint.disabled_at else "enabled"
        print(f"{state:8}  {_when(endpoint.updated_at):20}  {redact_url(endpoint.url):50}  "
              f"{endpoint.disabled_reason or ''}", file=out)
    return 0


def enable_endpoint(store: Store, url: str, out: TextIO | None = None) -> int:
    num_held = store.outbox.enable_endpoint(url)
    print(f"enabled {redact_url(url)}; {num_held} held event(s) are due now", file=out)
    return 0


def _print_event(event: WebhookRecord, out: TextIO | None) -> None:
    print(f"event {event.id}: {event.type}, {event.status}", file=out)
    print(f"  job: {event.job_id}", file=out)
    print(f"  url: {redact_url(event.url)}", file=out)
    print(f"  created: {_when(event.created_at)}", file=out)
    if event.delivered_at:
        print(f"  delivered: {_when(event.delivered_at)}", file=out)
    elif event.status == "pending":
        print(f"  next attempt: {_when(event.next_attempt_at)}", file=out)
    if event.last_error:
        print(f"  last error: {redact_text(event.last_error)}", file=out)


def _when(epoch_s: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(epoch_s))
