"""Files of the OpenAI-compatible API: bytes at rest under a root URL, a row per file
naming its owner (an API key).

Every lookup is by (owner, id): another key's file is not there, exactly as a file that
never existed, so nothing tells one key what another has. Ids are ours ("file-" and
hex), checked by `is_file_id` before they reach SQL or a path; a user's filename is
kept as a label only and never becomes part of a path.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import Engine, insert, select, update

from jobs.api_tables import api_files, newest_first_page
from storage.fs import is_local, join, make_dirs, resolve
from storage.write import write_bytes_atomic

FILE_ID = re.compile(r"^file-[0-9a-f]{24}$")


@dataclass(frozen=True)
class FileRecord:
    id: str
    key_id: str                # the owner
    purpose: str               # "batch" | "batch_output"
    filename: str              # a label, as uploaded
    bytes: int
    url: str                   # where the bytes are
    created_at: float


def is_file_id(value: str) -> bool:
    return bool(FILE_ID.match(value))


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex[:24]}"


class ApiFiles:
    def __init__(self, engine: Engine, root_url: str):
        self.engine = engine
        self.root_url = root_url.rstrip("/")

    def create(self, key_id: str, purpose: str, filename: str, data: bytes | Iterable[bytes]) -> FileRecord:
        """Write the bytes first, then the row: a row always has its bytes. `data` may be
        chunks (an upload streamed from its spool file): written as they come, and
        whatever a failing chunk iterator raises leaves no file behind."""
        file_id = new_file_id()
        folder = join(self.root_url, "files")
        if isinstance(data, bytes):
            write_bytes_atomic(folder, file_id, data)
            num_bytes = len(data)
        else:
            num_bytes = _write_chunks(folder, file_id, data)
        record = FileRecord(id=file_id, key_id=key_id, purpose=purpose, filename=filename[:255], bytes=num_bytes,
                            url=join(folder, file_id), created_at=time.time())
        with self.engine.begin() as conn:
            conn.execute(insert(api_files).values(id=record.id, key_id=key_id, purpose=purpose,
                                                  filename=record.filename, bytes=record.bytes, url=record.url,
                                                  created_at=record.created_at))
        return record

    def get(self, key_id: str, file_id: str) -> FileRecord | None:
        """The owner's live file, or None (unknown, deleted, another key's, or not an id)."""
        if not is_file_id(file_id):
            return None
        with self.engine.connect() as conn:
            row = conn.execute(select(api_files).where(api_files.c.id == file_id, api_files.c.key_id == key_id,
                                                       api_files.c.deleted_at.is_(None))).one_or_none()
        return None if row is None else _record(row)

    def list(self, key_id: str, *, purpose: str | None = None, after: str | None = None,
             limit: int = 10_000) -> tuple[list[FileRecord], bool]:
        """The owner's live files, newest first, after the file `after` (a cursor); and
        whether more follow."""
        query = select(api_files).where(api_files.c.key_id == key_id, api_files.c.deleted_at.is_(None))
        if purpose is not None:
            query = query.where(api_files.c.purpose == purpose)
        cursor = None
        if after is not None:
            cursor = self.get(key_id, after)
            if cursor is None:
                return [], False
        return newest_first_page(self.engine, api_files, query, cursor, limit, _record)

    def content(self, record: FileRecord) -> bytes:
        fs, path = resolve(record.url)
        return fs.cat_file(path)

    def delete(self, key_id: str, file_id: str) -> bool:
        """Mark the file deleted and remove its bytes; False if the owner has no such file."""
        record = self.get(key_id, file_id)
        if record is None:
            return False
        with self.engine.begin() as conn:
            result = conn.execute(update(api_files).where(api_files.c.id == file_id, api_files.c.deleted_at.is_(None))
                                  .values(deleted_at=time.time()))
        if not result.rowcount:
            return False
        fs, path = resolve(record.url)
        if fs.exists(path):
            fs.rm_file(path)
        return True


def _write_chunks(folder: str, name: str, chunks: Iterable[bytes]) -> int:
    """`folder/name` made of `chunks`, all or nothing; the bytes written."""
    fs, path = resolve(folder)
    make_dirs(fs, path)
    if is_local(fs):   # a temporary file beside it, renamed into place once complete
        temporary = os.path.join(path, f".{name}.{uuid.uuid4().hex}.tmp")
        try:
            with open(temporary, "wb") as file:
                num_bytes = sum(file.write(chunk) for chunk in chunks)
            os.replace(temporary, os.path.join(path, name))
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(temporary)
            raise
        return num_bytes
    # An object store shows the object only once close() completes it; a failure aborts the
    # upload instead (never `with fs.open(...)`, whose exit would complete a partial one).
    file = fs.open(join(path, name), "wb")
    try:
        num_bytes = sum(file.write(chunk) or len(chunk) for chunk in chunks)
        file.close()
    except BaseException:
        with contextlib.suppress(Exception):
            file.discard()
        file.closed = True
        raise
    return num_bytes


def _record(row) -> FileRecord:
    return FileRecord(id=row.id, key_id=row.key_id, purpose=row.purpose, filename=row.filename, bytes=row.bytes,
                      url=row.url, created_at=row.created_at)
