"""Output part files: one per shard, named deterministically, written atomically.

A reader of the output directory sees either no part or a whole one, never a
partial file:
  - local disk: write a hidden temporary file in the same directory, fsync it,
    then os.replace it onto the final name (atomic within one filesystem);
  - object stores and other fsspec backends: one put of the whole bytes
    (S3 makes an object visible only once its upload is complete).
A retried shard overwrites its part with the same name; since a re-run writes
the same rows, the content is the same.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from storage.errors import OutputError
from storage.fs import is_local, join, make_dirs, redact, resolve
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
        raise OutputError(f"output {redact(output)} is not writable: {_reason(error)}") from error


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
        else:
            fs.pipe_file(join(path, name), data)
    except Exception as error:  # noqa: BLE001 - every backend raises its own kinds
        raise OutputError(f"cannot write {name} to {redact(output)}: {_reason(error)}") from error


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


def _reason(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"

