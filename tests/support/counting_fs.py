"""Count the bytes an fsspec filesystem hands out to readers.

    with count_reads(fs) as reads:
        ...read through fs (e.g. storage.read_shard on memory:// URLs)...
    reads.num_bytes, reads.num_opens

It wraps the filesystem class's `_open`: fsspec keeps one instance per thread, and
storage reads footers from a thread pool. Everything that opens files through it is
counted: pyarrow's footer reads and its column chunk reads.
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
    real_open = cls._open

    def counting_open(self, path, mode="rb", **kwargs):
        if "r" not in mode:
            return real_open(self, path, mode, **kwargs)
        reads.add(num_opens=1)
        return _CountingFile(self.cat_file(path), reads)  # cat_file is not counted: it stands for the store

    cls._open = counting_open
    try:
        yield reads
    finally:
        cls._open = real_open
