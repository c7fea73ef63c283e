"""The errors file: one JSON line per failed row, like the OpenAI Batch API's error file.

    OUTPUT/errors.jsonl    {"id": 17, "error": "prompt is longer than the context"}
                           ...in result order: the manifest's parts, then row order

It is derived from the committed parts' `error` column, reading only the id and
error columns of each part, and written atomically before the manifest that lists
it, so a committed output never lists an errors file that is missing or partial:

    errors = write_errors_file(output, parts, id_column="doc_id")
    commit_output(output, Manifest(..., parts=parts, errors_file=errors))
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from storage.errors import OutputError
from storage.fs import describe, join, open_for_read, redact, resolve
from storage.write import PartInfo, write_bytes_atomic

ERRORS_NAME = "errors.jsonl"
ERROR_COLUMN = "error"


@dataclass(frozen=True)
class ErrorsFileInfo:
    """The written errors file, as the manifest lists it."""

    name: str  # file name within the output directory: ERRORS_NAME
    num_rows: int  # failed rows listed, one line each
    num_bytes: int
    sha256: str  # hex digest of the file's bytes


def write_errors_file(output: str, parts: Sequence[PartInfo], *, id_column: str,
                      storage_options: dict | None = None) -> ErrorsFileInfo:
    """Write OUTPUT/errors.jsonl from `parts` (in their order); an empty file when no row failed.

    Memory holds one batch of one part's id and error columns, plus the failed rows' lines.
    """
    lines = [line for part in parts for line in _error_lines(output, part, id_column, storage_options)]
    data = "".join(lines).encode("utf-8")
    write_bytes_atomic(output, ERRORS_NAME, data, storage_options)
    return ErrorsFileInfo(name=ERRORS_NAME, num_rows=len(lines), num_bytes=len(data),
                          sha256=hashlib.sha256(data).hexdigest())


def read_errors_file(output: str, info: ErrorsFileInfo, storage_options: dict | None = None) -> list[dict]:
    """The failed rows as {"id": ..., "error": ...}, checked against the manifest's checksum."""
    fs, path = resolve(output, storage_options)
    data = read_listed_file(fs, path, output, info.name, info.sha256)
    return [json.loads(line) for line in data.decode("utf-8").splitlines()]


def read_listed_file(fs, path: str, output: str, name: str, sha256: str) -> bytes:
    """The bytes of a file the manifest lists, refused if missing or not matching its checksum."""
    try:
        data = fs.cat_file(join(path, name))
    except FileNotFoundError as error:
        raise OutputError(f"{redact(output)}: the manifest lists {name}, which is missing") from error
    if hashlib.sha256(data).hexdigest() != sha256:
        raise OutputError(f"{redact(output)}: {name} does not match its checksum in the manifest")
    return data


def _error_lines(output: str, part: PartInfo, id_column: str, storage_options: dict | None) -> Iterator[str]:
    fs, path = resolve(output, storage_options)
    try:
        with open_for_read(fs, join(path, part.name)) as source, pq.ParquetFile(source) as parquet_file:
            for batch in parquet_file.iter_batches(columns=[id_column, ERROR_COLUMN], use_threads=False):
                yield from _failed_rows(batch, id_column)
    except (pa.ArrowException, OSError) as error:
        raise OutputError(f"{redact(output)}: cannot read the errors of {part.name} "
                          f"({describe(error, storage_options)})") from error


def _failed_rows(batch: pa.RecordBatch, id_column: str) -> Iterator[str]:
    failed = batch.filter(batch.column(ERROR_COLUMN).is_valid())
    for row_id, error in zip(failed.column(id_column).to_pylist(), failed.column(ERROR_COLUMN).to_pylist()):
        # default=str: ids of types JSON lacks (dates, decimals, bytes) still get a readable form
        yield json.dumps({"id": row_id, "error": error}, ensure_ascii=False, default=str) + "\n"
