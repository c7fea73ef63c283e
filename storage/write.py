"""Output part files: one per shard, named deterministically, written atomically.

A reader of the output directory sees either no part or a whole one, never a
partial file:
  - local disk: write a hidden temporary file in the same directory, fsync it,
    then os.replace it onto the final name (atomic within one filesystem);
  - object stores: one upload that the store makes visible only once complete:
    a single PUT below the filesystem's block size (s3fs: `default_block_size` in
    storage_options, 50 MiB unless set), a multipart upload of block-size parts at
    or above it. A failed upload is aborted, never completed with what it has;
  - other fsspec backends (memory://, ...): one put of the whole bytes.
A retried shard overwrites its part with the same name; since a re-run writes
the same rows, the content is the same.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from storage.errors import OutputError
from storage.fs import describe, is_local, is_object_store, join, make_dirs, redact, resolve
from storage.plan import ShardPlan


@dataclass(frozen=True)
class PartInfo:
    """One written part file, as the manifest lists it."""

    name: str  # file name within the output directory, e.g. "part-00000-00003.parquet"
    num_rows: int
    num_bytes: int
    sha256: str  # hex digest of the file's bytes


def part_name(shard: ShardPlan) -> str:
    """The part file name of a shard: the same on every attempt."""
    return f"part-{shard.file_index:05d}-{shard.shard_index:05d}.parquet"


def check_writable(output: str, storage_options: dict | None = None) -> None:
    """Create the output directory if needed and prove it takes a file (write, then delete a probe).

    Raises OutputError naming the URL and the reason.
    """
    probe_name = f"_barge_probe_{uuid.uuid4().hex}"
    try:
        fs, path = resolve(output, storage_options)
        make_dirs(fs, path)
        probe_path = join(path, probe_name)
        fs.pipe_file(probe_path, b"")
        fs.rm_file(probe_path)
    except Exception as error:  # noqa: BLE001 - every backend raises its own kinds
        raise OutputError(f"output {redact(output)} is not writable: {describe(error, storage_options)}") from error


def write_part(output: str, name: str, table: pa.Table, storage_options: dict | None = None) -> PartInfo:
    """Write `table` as the Parquet file `output/name`, atomically; overwriting is allowed."""
    _check_part_name(name)
    data = table_to_parquet_bytes(table)
    write_bytes_atomic(output, name, data, storage_options)
    return PartInfo(name=name, num_rows=table.num_rows, num_bytes=len(data), sha256=hashlib.sha256(data).hexdigest())


def table_to_parquet_bytes(table: pa.Table) -> bytes:
    """The whole Parquet file in memory: a shard's results are small, and one put needs all of it."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def write_bytes_atomic(output: str, name: str, data: bytes, storage_options: dict | None = None) -> None:
    """Make `output/name` hold `data`, with no moment where it holds anything partial."""
    try:
        fs, path = resolve(output, storage_options)
        make_dirs(fs, path)
        if is_local(fs):
            _replace_local(path, name, data)
        elif is_object_store(fs):
            _upload(fs, join(path, name), data)
        else:
            fs.pipe_file(join(path, name), data)
    except Exception as error:  # noqa: BLE001 - every backend raises its own kinds
        raise OutputError(f"cannot write {name} to {redact(output)}: {describe(error, storage_options)}") from error


def _upload(fs, path: str, data: bytes) -> None:
    """One object-store upload: single PUT under the block size, else multipart; all or nothing.

    NOTE: never `with fs.open(...)`: its exit closes the file even on an error, and
    closing completes a multipart upload with whatever parts it has, so a part whose
    upload failed would leave a short object in place. Here a failure discards the
    file instead: the multipart upload is aborted and nothing becomes visible.
    """
    file = fs.open(path, "wb")
    try:
        view = memoryview(data)
        # Block-sized writes make block-sized parts (one write of all would be one huge part).
        for start in range(0, len(data), file.blocksize):
            file.write(view[start:start + file.blocksize])
        file.close()  # the commit: PutObject, or CompleteMultipartUpload
    except BaseException:
        _abandon(file)
        raise


def _abandon(file) -> None:
    # An abort that fails too leaves only an invisible, unfinished upload (a bucket
    # lifecycle rule AbortIncompleteMultipartUpload reaps those); the first error is the one to report.
    with contextlib.suppress(Exception):
        file.discard()  # s3fs: AbortMultipartUpload
    file.closed = True  # so that garbage collection does not close, i.e. commit, it


def _replace_local(directory: str, name: str, data: bytes) -> None:
    temporary_path = os.path.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temporary_path, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary_path, os.path.join(directory, name))
    except BaseException:
        _remove_quietly(temporary_path)
        raise


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _check_part_name(name: str) -> None:
    # Names starting with "_" or "." are reserved for _SUCCESS, the manifest and temporary files.
    if not name or "/" in name or "\\" in name or name.startswith(("_", ".")):
        raise ValueError(f"part name {name!r} must be a plain file name not starting with '_' or '.'")

