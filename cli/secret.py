"""`barge secrets …`: the key that webhook secrets are stored under (jobs.secret_box).

    barge secrets generate-key     print a new key for BARGE_SECRET_KEY
    barge secrets rotate-key       re-encrypt every stored webhook secret under the newest key

With BARGE_SECRET_KEY="NEW,OLD" set on every process, rotate-key rewrites each secret
under NEW; then OLD can be dropped. A SQLite store without BARGE_SECRET_KEY keeps its key
in `secret.key` beside the database: there rotate-key makes the new key itself and keeps
the previous one after it, so processes still holding the old key read what it wrote.
Nothing here prints a webhook secret.
"""

from __future__ import annotations

import argparse
from typing import TextIO

from jobs.secret_box import KEY_ENV, SecretBox, generate_key, read_or_create_key_file, write_key_file
from jobs.settings import Settings
from jobs.store import Store


def add_commands(commands: argparse._SubParsersAction) -> None:
    secrets = commands.add_parser("secrets", help="the key webhook secrets are stored under")
    actions = secrets.add_subparsers(required=True, metavar="ACTION")
    generate = actions.add_parser("generate-key", help=f"print a new key for {KEY_ENV}")
    generate.set_defaults(func=lambda args: print_new_key())
    rotate = actions.add_parser("rotate-key", help="re-encrypt every stored webhook secret under the newest key")
    rotate.set_defaults(func=lambda args: rotate_key(Settings.from_env().database_url))


def print_new_key(out: TextIO | None = None) -> int:
    print(generate_key(), file=out)
    return 0


def rotate_key(database_url: str, out: TextIO | None = None) -> int:
    store = Store(database_url)
    store.migrate()
    if store.secrets.key_file is not None:
        _add_new_key(store.secrets)
    num_rewritten = store.reencrypt_secrets()
    print(f"re-encrypted {num_rewritten} stored webhook secret(s) under the newest key of {store.secrets.source}",
          file=out)
    if store.secrets.key_file is None and store.secrets.num_keys > 1:
        print(f"every secret now decrypts with the first key of {KEY_ENV} alone: once every client and worker "
              f"runs with it, drop the others", file=out)
    elif store.secrets.key_file is None:
        print(f"{KEY_ENV} holds one key: to rotate, set it to \"NEW,OLD\" everywhere, then run this again",
              file=out)
    store.engine.dispose()
    return 0


def _add_new_key(box: SecretBox) -> None:
    # NEW first, the previous key after it: a process that read the file before keeps
    # decrypting (and what it encrypts stays readable) until its next start.
    previous = read_or_create_key_file(box.key_file)[0]
    keys = [generate_key(), previous]
    write_key_file(box.key_file, keys)
    box.use_keys(keys)
