"""Barge's state on disk is its owner's alone: folders 0700, files 0600.

The SQLite database holds every job's spec (metadata, webhook URLs with their tokens)
and the webhook secrets, encrypted under `secret.key` beside it; the data folder also
holds uploaded batch files and the results cache. On a shared machine none of it may be
readable by another user, whatever the umask.

NOTE: SQLite gives its -wal and -shm files the database file's mode, so the database
file is created 0600 here, before SQLAlchemy first connects (SQLite would make it
0644 under the usual umask 022); -wal and -shm then follow.
An existing file or folder that others can read is tightened, with a warning, when this
user owns it. An existing folder named only as the parent of a database path is left as
it is: it may be /tmp or a home directory, and the files Barge puts in it are 0600.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("barge.store")

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
_OTHERS = stat.S_IRWXG | stat.S_IRWXO   # any bit for the group or for everyone else
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def make_private_dir(path: Path, *, tighten: bool) -> None:
    """Create `path` (0700; missing parents as the umask says); with `tighten`, an existing
    `path` that others can enter becomes 0700."""
    try:
        path.mkdir(mode=PRIVATE_DIR_MODE, parents=True)
    except FileExistsError:
        if tighten:
            tighten_mode(path, PRIVATE_DIR_MODE)


def make_private_file(path: Path) -> None:
    """Create `path` empty with mode 0600, or tighten it to 0600 if it exists."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, PRIVATE_FILE_MODE))
    except FileExistsError:
        tighten_mode(path, PRIVATE_FILE_MODE)


def make_private_sqlite(database: Path) -> None:
    """The database file 0600 in a folder created 0700, before SQLite opens it; a -wal,
    -shm or -journal left by an earlier Barge, tightened too."""
    make_private_dir(database.parent, tighten=False)
    make_private_file(database)
    for suffix in SQLITE_SIDE_FILES:
        side = database.with_name(database.name + suffix)
        if side.exists():
            tighten_mode(side, PRIVATE_FILE_MODE)


def tighten_mode(path: Path, mode: int) -> None:
    """chmod `path` to `mode` if others have any access to it and this user owns it;
    a warning either way, since another user could read it until now."""
    status = path.stat()
    if not status.st_mode & _OTHERS:
        return
    was = stat.S_IMODE(status.st_mode)
    if status.st_uid != os.getuid():
        log.warning("%s is mode %o and owned by another user: others may read Barge's state there", path, was)
        return
    try:
        os.chmod(path, mode)
    except OSError as error:   # a read-only file system: Barge still runs, and says so
        log.warning("%s is mode %o, readable by others, and cannot be changed: %s", path, was, error)
        return
    log.warning("%s was mode %o, readable by others: now %o", path, was, mode)


def tighten_data_dir(data_dir: Path) -> None:
    """BARGE_DATA_DIR is Barge's own folder: made 0700 if an earlier Barge left it open.
    Not created here (a client on PostgreSQL may have no writable home); whatever writes
    into it first creates it 0700 (the store, the key file, the embedded broker)."""
    if data_dir.is_dir():
        tighten_mode(data_dir, PRIVATE_DIR_MODE)
