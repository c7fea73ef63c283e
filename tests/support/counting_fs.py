"""Count the bytes an fsspec filesystem hands out to readers.

    with count_reads(fs) as reads:
        ...read through fs (e.g. storage.read_shard on memory:// URLs)...
    reads.num_bytes, reads.num_opens

It wraps the filesystem class's `_open` and `cat_file`: fsspec keeps one instance per
thread, and storage reads footers from a thread pool. Everything that reads files
through it is counted: footers read by their tail (`cat_file` with a range, one request
each) and the column chunks pyarrow reads from an open file.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import fsspec


@dataclass
class Reads:
    num_bytes: int = 0
    num_opens: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, num_bytes: int = 0, num_opens: int = 0) -> None:
        with self._lock:  # footers are read from several threads at once
            self.num_bytes += num_bytes
            self.num_opens += num_opens

    def reset(self) -> None:
        with self._lock:
            self.num_bytes = self.num_opens = 0


class _CountingFile(io.BytesIO):
    def __init__(self, data: bytes, reads: Reads) -> None:
        super().__init__(data)
        self._reads = reads

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        self._reads.add(num_bytes=len(chunk))
        return chunk

    def readinto(self, buffer) -> int:
        count = super().readinto(buffer)
        self._reads.add(num_bytes=count)
        return count


@contextmanager
def count_reads(fs: fsspec.AbstractFileSystem) -> Iterator[Reads]:
    """Count reads of files opened "rb" on `fs`'s kind of filesystem (best with memory://: in-process)."""
    reads = Reads()
    cls = type(fs)
    real_open, real_cat_file = cls._open, cls.cat_file

    def counting_open(self, path, mode="rb", **kwargs):
        if "r" not in mode:
            return real_open(self, path, mode, **kwargs)
        reads.add(num_opens=1)
        return _CountingFile(real_cat_file(self, path), reads)   # the store's bytes, counted as they are read

    def counting_cat_file(self, path, start=None, end=None, **kwargs):
        """A ranged read (storage reads footers by their tail this way): one request."""
        data = real_cat_file(self, path, start=start, end=end, **kwargs)
        reads.add(num_bytes=len(data), num_opens=1)
        return data

    cls._open, cls.cat_file = counting_open, counting_cat_file
    try:
        yield reads
    finally:
        cls._open, cls.cat_file = real_open, real_cat_file
