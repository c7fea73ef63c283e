"""`barge api-key …`: the keys of the OpenAI-compatible API that `barge serve` serves (api/).

    barge api-key create --name NAME [--operator]   prints the key once; only its SHA-256 is stored
    barge api-key list | revoke KEY_ID
"""

from __future__ import annotations

import argparse
import datetime
from typing import TextIO

from jobs.api_keys import ApiKeys
from jobs.settings import Settings
from jobs.store import Store


def add_commands(commands: argparse._SubParsersAction) -> None:
    keys = commands.add_parser("api-key", help="API keys for barge serve")
    actions = keys.add_subparsers(required=True, metavar="ACTION")
    create = actions.add_parser("create", help="make a key (shown once)")
    create.add_argument("--name", required=True, help="who or what the key is for")
    create.add_argument("--operator", action="store_true",
                        help="an operator's key: its dashboard shows every key's jobs, workers and schedules")
    create.set_defaults(func=lambda args: create_key(_keys(), args.name, operator=args.operator))
    listing = actions.add_parser("list", help="list keys (never their secrets)")
    listing.set_defaults(func=lambda args: list_keys(_keys()))
    revoke = actions.add_parser("revoke", help="stop a key from authenticating")
    revoke.add_argument("key_id")
    revoke.set_defaults(func=lambda args: revoke_key(_keys(), args.key_id))


def create_key(keys: ApiKeys, name: str, out: TextIO | None = None, *, operator: bool = False) -> int:
    created = keys.create(name, operator=operator)
    kind = "operator key" if operator else "api key"
    print(f"{kind} {created.key.id} ({created.key.name}); the key, shown once:", file=out)
    print(created.secret, file=out)
    return 0


def list_keys(keys: ApiKeys, out: TextIO | None = None) -> int:
    for key in keys.list():
        state = "revoked " + _when(key.revoked_at) if key.revoked_at else "live"
        role = "operator" if key.is_operator else "key"
        print(f"{key.id:24}  {_when(key.created_at)}  {state:28}  {role:8}  {key.name}", file=out)
    return 0


def revoke_key(keys: ApiKeys, key_id: str, out: TextIO | None = None) -> int:
    revoked = keys.revoke(key_id)
    print(f"{key_id}: revoked" if revoked else f"{key_id}: no such live key", file=out)
    return 0 if revoked else 1


def _keys() -> ApiKeys:
    store = Store(Settings.from_env().database_url)
    store.migrate()
    return ApiKeys(store.engine)


def _when(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
