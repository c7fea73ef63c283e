"""`barge cache …`: the results cache of incremental jobs.

    barge cache move --to s3://bucket/barge-cache [--from PATH] [--dry-run]
        run on each host that holds cache files on its own disk (jobs.cache_move)
"""

from __future__ import annotations

import argparse

from jobs.client import Client
from jobs.hosts import check_setting


def add_commands(commands: argparse._SubParsersAction) -> None:
    cache = commands.add_parser("cache", help="the results cache of incremental jobs: move it where every host reads")
    actions = cache.add_subparsers(required=True, metavar="ACTION")
    move = actions.add_parser("move", help="move this host's cache files to a URL every host reads, "
                                           "re-pointing the shared index file by file")
    move.add_argument("--to", required=True, metavar="URL", help="the new cache root, e.g. s3://bucket/barge-cache")
    move.add_argument("--from", dest="source", metavar="PATH",
                      help="this host's cache folder (default: the data directory's cache/)")
    move.add_argument("--dry-run", action="store_true", help="print what would move, move nothing")
    move.set_defaults(func=_move)


def _move(args) -> int:
    from jobs.cache_move import move_cache
    client = Client()
    check_setting("--to", args.to, client.settings)   # many hosts: a URL every one of them reads (jobs.hosts)
    source = args.source or str(client.settings.data_dir / "cache")
    report = move_cache(client.store, source, args.to, dry_run=args.dry_run)
    print("\n".join(report.lines()))
    return 1 if report.failed else 0
