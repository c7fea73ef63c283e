"""The embedded default's broker: kombu's filesystem transport, made safe to share.

kombu's own filesystem transport (kombu #1551) creates a message file and only then
writes it, so a consumer listing the folder in between reads an empty file; the JSON
error escapes into Celery's consumer loop, which stops the worker. A file left
unreadable (a producer killed mid-write, a file from an older version) then stops
every worker that reads it. Its exchange tables (the bindings producers look up) are
rewritten in place the same way, so two processes starting together can read a
half-written table or lose one of two bindings.

Here every file appears whole or not at all: written under a name no reader looks at,
then renamed into place. A reader claims a message by renaming it into `processing/`
(atomic on one filesystem: two readers never both get it), and a message it cannot
turn into a kombu message is moved into `bad/` with a log line, never raised. Its
work is not lost: queueing.housekeeping sends a shard whose message was never
claimed again after BARGE_REQUEUE_AFTER_S, like any lost message.

Registered as the transport of `filesystem://` URLs in jobs.messaging.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
import uuid
from collections import deque
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.transport.virtual import BrokerState, Empty
from kombu.utils.json import dumps, loads

log = logging.getLogger("barge.broker")

PROCESSING_FOLDER = "processing"   # inside the queue folder: messages being read
BAD_FOLDER = "bad"                 # inside the queue folder: messages that could not be read


def write_atomically(path: Path, data: bytes) -> None:
    """`data` at `path`, whole: readers see the old file, or none, or all of the new."""
    staging = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(staging, "wb") as file:
            file.write(data)
        os.replace(staging, path)
    except OSError:
        staging.unlink(missing_ok=True)
        raise


def bad_message_count(queue_folder: Path) -> int:
    """How many unreadable messages were set aside in `queue_folder` (a metric)."""
    try:
        return sum(1 for _ in (queue_folder / BAD_FOLDER).iterdir())
    except FileNotFoundError:
        return 0


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        # <time>_<uuid>.<queue>.msg: readers match the queue and take the oldest first. Unlike
        # kombu's milliseconds, nanoseconds (zero-padded, so names sort as numbers) keep a
        # burst from one producer in order.
        name = f"{time.monotonic_ns():020d}_{uuid.uuid4()}.{queue}.msg"
        try:
            write_atomically(Path(self.data_folder_out) / name, dumps(payload).encode())
        except OSError as exc:
            raise ChannelError(f"cannot add message {name!r} to {self.data_folder_out}") from exc

    def _get(self, queue):
        folder = Path(self.data_folder_in)
        for name in self._oldest_first(folder, queue):
            claimed = self._claim(folder, name)
            if claimed is None:
                continue   # another reader took it
            payload = self._read(claimed)
            if payload is not None:
                return payload
        raise Empty()

    @cached_property
    def _listed(self) -> dict[str, deque[str]]:
        """queue -> its message names from the last listing not yet tried, oldest first."""
        return {}

    def _oldest_first(self, folder: Path, queue: str) -> Iterator[str]:
        """The queue's message names, oldest first: those left from the last listing, then a
        new listing's. A name starts with the system-wide monotonic clock of its put, so a
        message put since the listing sorts after every name in it.

        NOTE: listing and sorting the folder for every message made a backlog quadratic:
        one reader taking a backlog of 5,000 messages used 6.8 s of CPU, 0.36 s with this, and
        bench/broker_bench.py (3,000 messages, a producer and two consumers at once) consumed
        3,206 messages/s before, 7,129 after (2-core Intel Xeon, 2026-12-07). At
        the message storm's size (tests/e2e/test_broker_resilience.py, 3,000 shard messages
        in windows of 1,000) the test's CPU was the same either way (104 against 105 s).
        A name another reader claimed since costs one failed rename."""
        listed = self._listed.setdefault(queue, deque())
        while listed:
            yield listed.popleft()
        suffix = f"{queue}.msg"
        listed.extend(sorted(name for name in os.listdir(folder) if name.partition(".")[2] == suffix))
        while listed:
            yield listed.popleft()

    @cached_property
    def _processing_folder(self) -> Path:
        folder = Path(self.data_folder_in) / PROCESSING_FOLDER
        folder.mkdir(exist_ok=True)
        return folder

    def _claim(self, folder: Path, name: str) -> Path | None:
        processing = self._processing_folder   # made once per channel, not per message
        try:
            os.rename(folder / name, processing / name)
        except FileNotFoundError:
            return None
        return processing / name

    def _read(self, path: Path) -> dict | None:
        """The message at `path` (removed once read), or None if it cannot be one: then it
        is moved aside into bad/."""
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ChannelError(f"cannot read message {path}") from exc
        try:
            payload = loads(data)
            self.Message(payload, channel=self)   # what kombu will do with it: properties, body encoding
        except Exception as exc:   # empty, truncated, not JSON, not a kombu message: never the worker's end
            self._set_aside(path, f"{type(exc).__name__}: {exc}", len(data))
            return None
        path.unlink(missing_ok=True)
        return payload

    def _set_aside(self, path: Path, reason: str, num_bytes: int) -> None:
        bad = path.parent.parent / BAD_FOLDER
        bad.mkdir(exist_ok=True)
        os.replace(path, bad / path.name)
        log.error("unreadable message %s (%d bytes: %s) moved to %s; the housekeeper re-sends the work "
                  "it stood for", path.name, num_bytes, reason, bad)

    # -- exchange tables: read whole, rewritten atomically under a lock -------------------

    def get_table(self, exchange):
        try:
            table = loads(self._exchange_file(exchange).read_bytes())
        except FileNotFoundError:
            return []
        return [filesystem.exchange_queue_t(*binding) for binding in table]

    def _queue_bind(self, exchange, routing_key, pattern, queue):
        binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        with self._table_lock(exchange):
            table = self.get_table(exchange)
            if binding not in table:
                self._write_table(exchange, [binding] + table)

    def _delete(self, queue, exchange, routing_key, pattern, *args, **kwargs):
        super(filesystem.Channel, self)._delete(queue, exchange, routing_key, pattern, *args, **kwargs)
        binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        with self._table_lock(exchange):
            table = self.get_table(exchange)
            if binding in table:
                self._write_table(exchange, [b for b in table if b != binding])

    def _write_table(self, exchange, table) -> None:
        write_atomically(self._exchange_file(exchange), dumps(table).encode())

    def _table_lock(self, exchange) -> "_FileLock":
        self.control_folder.mkdir(parents=True, exist_ok=True)
        return _FileLock(self._exchange_file(exchange).with_suffix(".lock"))


class _FileLock:
    """An exclusive lock on `path` across processes (fcntl), held within a `with`."""

    def __init__(self, path: Path):
        self.path = path
        self.file = None

    def __enter__(self) -> "_FileLock":
        self.file = open(self.path, "a")
        fcntl.flock(self.file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc_info) -> None:
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


class Transport(filesystem.Transport):
    Channel = Channel

    def __init__(self, client, **kwargs):
        super().__init__(client, **kwargs)
        # What a connection declared is remembered per connection, not per process (as
        # kombu's does): the bindings live in the folders this connection names, and one
        # process may use several (tests, benchmarks). Declaring again is idempotent.
        self.state = BrokerState()
