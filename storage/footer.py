"""A Parquet file's footer, fetched with the fewest bytes, and checked against the file.

NOTE: pyarrow opening a remote file reads its last 64 KiB to find the footer: for a
small file that is the whole file, fetched again when the column chunks are read,
and for every file it is more than the footer (a few KiB). Here the footer is
fetched as a tail of FOOTER_GUESS_BYTES (one ranged GET; a second only for a
larger footer) and handed to pyarrow as `metadata=`, so readers fetch the footer
and then only the column chunks they need.
"""

from __future__ import annotations

import os
import struct
import threading
from collections import OrderedDict
from contextlib import contextmanager
from collections.abc import Iterator
from dataclasses import dataclass

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from storage.errors import InputError
from storage.fs import is_local, redact

FOOTER_GUESS_BYTES = 8 * 1024
# A remote file no bigger is read whole by its shard (storage.read), so a reader that will want
# its rows (storage.inputs keep_columns) fetches it whole for its footer too.
WHOLE_FILE_BYTES = 64 * 1024
_TRAILER_BYTES = 8  # footer length (4 bytes, little-endian) then b"PAR1"
_MIN_FILE_BYTES = 12  # b"PAR1", then the trailer: a file without even an empty footer
# A worker reads a local file's footer for every shard cut from it: a file of a thousand small
# row groups has a footer of about 200 KiB, 4 ms to parse and check, as much as a small shard's
# forward. Footers read and checked are kept per process by (path, size, mtime), up to this
# many bytes of serialized footer; a file rewritten since is read again.
LOCAL_FOOTER_CACHE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Footer:
    metadata: pq.FileMetaData
    num_bytes: int  # the file's size
    whole_file: bytes | None = None  # the file's bytes when the footer's fetch took all of it


def read_footer(fs: fsspec.AbstractFileSystem, path: str, url: str, num_bytes: int = 0,
                whole_up_to: int = FOOTER_GUESS_BYTES) -> Footer:
    """The footer of the Parquet file at `path`; `num_bytes` saves asking the size when known.
    A remote file of up to `whole_up_to` bytes is fetched whole (Footer.whole_file).

    Raises InputError naming `url` when the file is not Parquet or its footer lies
    (row counts that do not add up, column chunks past the end of the data).
    """
    if is_local(fs):
        return _local_footers.read(path, url)      # kept while the file is unchanged
    num_bytes = num_bytes or fs.size(path)
    tail = _fetch_footer(fs, path, url, num_bytes, num_bytes if num_bytes <= whole_up_to else FOOTER_GUESS_BYTES)
    metadata = pq.read_metadata(pa.BufferReader(tail))
    footer = Footer(metadata, num_bytes, tail if len(tail) == num_bytes else None)
    check_footer(url, footer.metadata, footer.num_bytes)
    return footer


class _LocalFooters:
    """Checked footers of local files by (path, size, mtime), least recently used first out."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self.footers: OrderedDict[tuple[str, int, int], Footer] = OrderedDict()
        self.lock = threading.Lock()

    def read(self, path: str, url: str) -> Footer:
        stat = os.stat(path)
        key = (path, stat.st_size, stat.st_mtime_ns)
        with self.lock:
            footer = self.footers.get(key)
            if footer is not None:
                self.footers.move_to_end(key)
                return footer
        footer = Footer(pq.read_metadata(path), stat.st_size)
        check_footer(url, footer.metadata, footer.num_bytes)
        with self.lock:
            if key not in self.footers and footer.metadata.serialized_size <= self.max_bytes:
                self.footers[key] = footer
                self.num_bytes += footer.metadata.serialized_size
                while self.num_bytes > self.max_bytes:
                    _, evicted = self.footers.popitem(last=False)
                    self.num_bytes -= evicted.metadata.serialized_size
        return footer


_local_footers = _LocalFooters(LOCAL_FOOTER_CACHE_BYTES)


@contextmanager
def open_parquet(fs: fsspec.AbstractFileSystem, path: str, footer: Footer) -> Iterator[pq.ParquetFile]:
    """The file for reading column chunks: from the bytes in hand, or by ranged reads."""
    if footer.whole_file is not None:
        with pq.ParquetFile(pa.BufferReader(footer.whole_file), metadata=footer.metadata) as parquet_file:
            yield parquet_file
        return
    if is_local(fs):
        with pq.ParquetFile(path, metadata=footer.metadata) as parquet_file:
            yield parquet_file
        return
    # Uncached, as storage.fs.open_for_read explains; the known size spares a request for it.
    with fs.open(path, "rb", cache_type="none", size=footer.num_bytes) as source, \
            pq.ParquetFile(source, metadata=footer.metadata) as parquet_file:
        yield parquet_file


def _fetch_footer(fs: fsspec.AbstractFileSystem, path: str, url: str, num_bytes: int, guess_bytes: int) -> bytes:
    """The file's last bytes, footer and trailer included (all of a file up to `guess_bytes`)."""
    if num_bytes < _MIN_FILE_BYTES:
        raise InputError(f"{redact(url)}: {num_bytes} bytes is too short for a Parquet file")
    tail = fs.cat_file(path, start=max(0, num_bytes - guess_bytes), end=num_bytes)
    if tail[-4:] != b"PAR1":
        raise InputError(f"{redact(url)}: not a Parquet file (it does not end with the Parquet magic bytes)")
    footer_bytes = struct.unpack("<I", tail[-_TRAILER_BYTES:-4])[0] + _TRAILER_BYTES
    if footer_bytes > num_bytes:
        raise InputError(f"{redact(url)}: its footer claims {footer_bytes} bytes in a {num_bytes}-byte file")
    if footer_bytes > len(tail):
        tail = fs.cat_file(path, start=num_bytes - footer_bytes, end=num_bytes - len(tail)) + tail
    return tail


def check_footer(url: str, metadata: pq.FileMetaData, num_bytes: int) -> None:
    """A footer whose row counts disagree, or whose column chunks lie past the data, names its file."""
    data_end = num_bytes - metadata.serialized_size - _TRAILER_BYTES
    rows_in_groups = 0
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        rows_in_groups += group.num_rows
        for column in range(group.num_columns):
            chunk = group.column(column)
            start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
            if start is not None and start + chunk.total_compressed_size > data_end:
                raise InputError(f"{redact(url)}: its footer lies: row group {index} column {chunk.path_in_schema!r} "
                                 f"ends at byte {start + chunk.total_compressed_size}, past the data's "
                                 f"{data_end} bytes")
    if rows_in_groups != metadata.num_rows:
        raise InputError(f"{redact(url)}: its footer lies: {metadata.num_rows} rows, but its row groups "
                         f"hold {rows_in_groups}")
