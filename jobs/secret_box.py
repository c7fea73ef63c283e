"""Webhook secrets at rest: encrypted in the database with Fernet keys that live outside it.

NOTE: BARGE_SECRET_KEY holds one or more Fernet keys, comma-separated, newest first.
The first encrypts; each of them decrypts (cryptography's MultiFernet). A key rotation
is therefore three steps, with no moment at which a stored secret cannot be read:

    1. BARGE_SECRET_KEY="NEW,OLD" on every process that opens the store
    2. barge secrets rotate-key        every stored secret re-encrypted under NEW
    3. BARGE_SECRET_KEY="NEW"

Without BARGE_SECRET_KEY, a SQLite store (the embedded default) keeps its key in a file
beside the database, `secret.key` (mode 0600), created on first use: the secrets do not
leave with a copy of the database file alone. Any other store refuses to open without
the key: it could neither keep a new job's secret nor sign a delivery.

A stored value is "fernet:" + token. A value without the prefix is a secret an older
Barge stored in plain text: `decrypt` returns it as it is, and `Store.migrate` encrypts it.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from jobs.private_files import make_private_dir

KEY_ENV = "BARGE_SECRET_KEY"
KEY_FILE_NAME = "secret.key"
PREFIX = "fernet:"


class SecretKeyError(ValueError):
    """No key to open the store with, a malformed key, or a stored secret no key decrypts."""


class SecretBox:
    """Encrypts and decrypts stored webhook secrets; never logs or echoes one."""

    def __init__(self, keys: Sequence[str], *, source: str = KEY_ENV, key_file: Path | None = None):
        self.source = source       # where the keys came from, for messages: the variable or the key file
        self.key_file = key_file   # read again when a value does not decrypt: `rotate-key` may have rewritten it
        self.use_keys(keys)

    @classmethod
    def for_store(cls, database_url: str, environ: Mapping[str, str] = os.environ) -> SecretBox:
        """The keys in BARGE_SECRET_KEY; else a SQLite store's key file (created if absent);
        else SecretKeyError: the store must not open."""
        keys = [key for key in environ.get(KEY_ENV, "").split(",") if key.strip()]
        if keys:
            return cls(keys)
        if database_url.startswith("sqlite"):
            path = key_file_path(database_url)
            if path is None:   # an in-memory database: its secrets die with it
                return cls([generate_key()], source="an in-memory key")
            return cls(read_or_create_key_file(path), source=str(path), key_file=path)
        raise SecretKeyError(f"{KEY_ENV} is not set: a store on {database_url.split(':', 1)[0]} keeps webhook "
                             f"secrets encrypted and will not open without the key; make one with "
                             f"`barge secrets generate-key` and set it on every client and worker")

    def encrypt(self, secret: str | None) -> str | None:
        if secret is None:
            return None
        return PREFIX + self._fernet.encrypt(secret.encode()).decode("ascii")

    def decrypt(self, stored: str | None) -> str | None:
        if stored is None or not is_encrypted(stored):
            return stored   # None, or written in plain text by an older Barge
        token = stored.removeprefix(PREFIX).encode("ascii")
        return self._with_current_keys(lambda fernet: fernet.decrypt(token)).decode()

    def reencrypt(self, stored: str) -> str:
        """`stored` encrypted under the first key, whichever key (or none) it was under."""
        if not is_encrypted(stored):
            return self.encrypt(stored)
        token = stored.removeprefix(PREFIX).encode("ascii")
        return PREFIX + self._with_current_keys(lambda fernet: fernet.rotate(token)).decode("ascii")

    def _with_current_keys(self, use: Callable[[MultiFernet], bytes]) -> bytes:
        try:
            return use(self._fernet)
        except InvalidToken:
            if self.key_file is not None:   # the file may have a newer key than this process read
                self.use_keys(read_or_create_key_file(self.key_file))
                try:
                    return use(self._fernet)
                except InvalidToken:
                    pass
        raise SecretKeyError(f"a stored webhook secret cannot be decrypted with the key(s) in {self.source}: "
                             f"was the key replaced without `barge secrets rotate-key`? List the old key "
                             f"after the new one") from None

    def use_keys(self, keys: Sequence[str]) -> None:
        """Encrypt under keys[0] and decrypt with any of them from now on."""
        if not keys:
            raise SecretKeyError(f"{self.source}: no key")
        try:
            self._fernet = MultiFernet([Fernet(key.strip()) for key in keys])
        except (ValueError, TypeError):   # the message would not quote the key, but keep it out anyway
            raise SecretKeyError(f"{self.source}: not a Fernet key (32 url-safe base64-encoded bytes); "
                                 "make one with `barge secrets generate-key`") from None
        self.num_keys = len(keys)


def is_encrypted(stored: str) -> bool:
    return stored.startswith(PREFIX)


def generate_key() -> str:
    return Fernet.generate_key().decode("ascii")


def key_file_path(database_url: str) -> Path | None:
    """`secret.key` beside a SQLite database file; None for an in-memory database."""
    path = database_url.split(":///", 1)[1].split("?", 1)[0] if ":///" in database_url else ""
    if not path or path == ":memory:":
        return None
    return Path(os.path.expanduser(path)).parent / KEY_FILE_NAME


def read_or_create_key_file(path: Path) -> list[str]:
    """The keys in `path`, one a line, newest first; a new key if there is no file yet.

    Two processes that start at once both write a candidate and link it into place:
    link fails for the second, which then reads the first's key, never a partial file.
    """
    if not path.exists():
        make_private_dir(path.parent, tighten=False)   # the store's folder, when the key comes first
        write_key_file(path, [generate_key()], replace=False)
    keys = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if not keys:
        raise SecretKeyError(f"{path}: holds no key")
    return keys


def write_key_file(path: Path, keys: Sequence[str], *, replace: bool = True) -> None:
    """Write `keys` to `path` (mode 0600) atomically; with replace=False only if absent."""
    descriptor, candidate = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{secrets.token_hex(4)}.")
    try:
        os.fchmod(descriptor, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write("".join(f"{key}\n" for key in keys))
            file.flush()
            os.fsync(file.fileno())
        if replace:
            os.replace(candidate, path)
        else:
            try:
                os.link(candidate, path)
            except FileExistsError:
                pass   # another process made it first: use theirs
    finally:
        if os.path.exists(candidate):
            os.unlink(candidate)
