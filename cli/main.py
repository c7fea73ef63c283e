"""`barge`: a thin command line over the client (and the worker).

    barge submit --mode embed --model minilm --input 'corpus/*.parquet' --output out/
    barge status JOB | wait JOB | cancel JOB | results JOB | report JOB | jobs
    barge worker --model minilm
    barge webhooks list | show EVENT | replay EVENT | endpoints | enable URL | prune | rotate-secret JOB
    barge secrets generate-key | rotate-key
    barge schedule add | list | runs | pause | resume | run-now | remove | prune;  barge beat
    barge demo
    barge models pull NAME... | list   (Hub ids: org/name[@revision][:quant], jobs.hub_models)
    barge quantize SRC DST [--scheme fp8|fp8-block|fp8-group] | eval-quant MODEL   (engine/quant/)
    barge serve | api-key create|list|revoke   (the OpenAI Files and Batches API, api/)
    barge cache move --to URL [--from PATH] [--dry-run]   (a host's results cache to a shared URL)
"""

from __future__ import annotations

import argparse
import sys

from cli import api_key, cache, demo, job, model, quant, schedule, secret, serve, webhook, worker
from jobs.client import JobFailed
from jobs.schedules import ScheduleError
from jobs.spec import JobSpecError
from storage.errors import StorageError
from storage.redaction import redact_text

# In the order `barge --help` lists their commands.
COMMAND_GROUPS = (job, worker, webhook, secret, schedule, quant, model, serve, api_key, cache, demo)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except JobSpecError as exc:
        print(f"barge: job refused: {redact_text(str(exc))}", file=sys.stderr)
        return 2
    except ScheduleError as exc:
        print(f"barge: schedule refused: {exc}", file=sys.stderr)
        return 2
    except (KeyError, JobFailed, TimeoutError, ValueError, StorageError) as exc:
        print(f"barge: {redact_text(str(exc.args[0] if exc.args else exc))}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="barge", description="Offline batch inference over Parquet corpora.")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.add_commands(commands)
    return parser


if __name__ == "__main__":
    sys.exit(main())
