"""The job's manifest, the commit of an output directory, and reading results back.

    OUTPUT/part-00000-00000.parquet   parts, written by write_part as shards finish
    OUTPUT/errors.jsonl               optional: the failed rows (storage.errors_file)
    OUTPUT/top_n.parquet              optional: a score job's best rows per group (storage.top_n_file)
    OUTPUT/_manifest.json             the parts that make up the result, in order
    OUTPUT/_SUCCESS                   written last: the output is committed

A job that ends without finishing (expired, cancelled, failed) still gets a manifest,
marked with its status and listing the parts of the shards it did commit, but no
_SUCCESS: `read_results(output, partial=True)` reads what it finished, the way the
OpenAI Batch API returns the completed requests of an expired batch. Retrying the job
and finishing it replaces that manifest with a complete one and writes _SUCCESS.

NOTE: the manifest, not a listing, defines the result. A directory may hold
parts of attempts that never committed, or parts of shards the job later gave
up on; readers take exactly the parts the manifest lists, and only once
_SUCCESS exists. Re-committing (e.g. after retrying failed shards) replaces the
manifest atomically; parts are only ever overwritten with identical content, so
a reader sees either manifest whole with all its parts present.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from storage.errors import OutputError
from storage.errors_file import ErrorsFileInfo, read_errors_file, read_listed_file
from storage.fs import join, redact, resolve
from storage.stage import remove_staging
from storage.write import PartInfo, write_bytes_atomic

MANIFEST_NAME = "_manifest.json"
SUCCESS_NAME = "_SUCCESS"
FORMAT_VERSION = 1
COMPLETE = "succeeded"
PARTIAL_STATUSES = ("expired", "cancelled", "failed")


@dataclass(frozen=True)
class Manifest:
    """What a committed output holds and how it was made."""

    job_id: str
    mode: str  # "embed" | "generate" | "transcribe"
    model: str
    spec: dict  # the job's spec, JSON-serialisable; written to the output, so never with credentials in it
    parts: tuple[PartInfo, ...]  # in result order
    schema: str  # encode_schema(output schema); gives the columns even when there are no parts
    stats: dict  # e.g. {"total": ..., "succeeded": ..., "failed": ...}, JSON-serialisable
    created_at: str  # ISO 8601, UTC
    errors_file: ErrorsFileInfo | None = None  # from write_errors_file; None: the job wrote none
    status: str = COMPLETE  # or a PARTIAL_STATUSES entry: the job ended with only these parts
    top_n_file: PartInfo | None = None  # a score job with top_n: storage.top_n_file's; None: none written

    def __post_init__(self) -> None:
        if self.status != COMPLETE and self.status not in PARTIAL_STATUSES:
            raise ValueError(f"manifest status must be {COMPLETE!r} or one of {PARTIAL_STATUSES}, got {self.status!r}")
        names = [part.name for part in self.parts]
        if len(set(names)) != len(names):
            raise ValueError(f"manifest lists a part twice: {sorted(n for n in set(names) if names.count(n) > 1)}")
        decode_schema(self.schema)

    @property
    def is_complete(self) -> bool:
        return self.status == COMPLETE

    @property
    def num_rows(self) -> int:
        return sum(part.num_rows for part in self.parts)

    @property
    def arrow_schema(self) -> pa.Schema:
        return decode_schema(self.schema)

    def to_json(self) -> str:
        body = {"format_version": FORMAT_VERSION, **asdict(self),
                "schema_text": self.arrow_schema.to_string(show_schema_metadata=False)}
        return json.dumps(body, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        body = json.loads(text)
        parts = tuple(PartInfo(**part) for part in body["parts"])
        # Manifests written before errors files existed have no such key.
        errors_file = ErrorsFileInfo(**body["errors_file"]) if body.get("errors_file") else None
        top_n_file = PartInfo(**body["top_n_file"]) if body.get("top_n_file") else None
        return cls(job_id=body["job_id"], mode=body["mode"], model=body["model"], spec=body["spec"],
                   parts=parts, schema=body["schema"], stats=body["stats"], created_at=body["created_at"],
                   errors_file=errors_file, status=body.get("status", COMPLETE), top_n_file=top_n_file)


def encode_schema(schema: pa.Schema) -> str:
    """An Arrow schema as text that `decode_schema` restores exactly (base64 of its IPC form)."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def decode_schema(text: str) -> pa.Schema:
    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text, validate=True)))
    except (ValueError, pa.ArrowException) as error:
        raise ValueError(f"manifest schema is not an encode_schema() string: {text[:40]!r}...") from error


def commit_output(output: str, manifest: Manifest, storage_options: dict | None = None, *,
                  before_success: Callable[[], None] | None = None) -> None:
    """Check every listed part (and errors and top-N file) is there, write _manifest.json atomically, then _SUCCESS last;
    then remove the job's staged input (storage.stage). `before_success` runs between the
    two writes (crash tests stop a process there). Committing again rewrites both: harmless."""
    _check_parts_present(output, manifest, storage_options)
    write_bytes_atomic(output, MANIFEST_NAME, manifest.to_json().encode("utf-8"), storage_options)
    if before_success is not None:
        before_success()
    write_bytes_atomic(output, SUCCESS_NAME, b"", storage_options)
    remove_staging(output, manifest.job_id, storage_options)   # nothing can read it again


def write_partial_manifest(output: str, manifest: Manifest, storage_options: dict | None = None) -> None:
    """The manifest of a job that ended unfinished: its parts are checked as for a commit,
    but no _SUCCESS is written, so readers that want the whole result still refuse it."""
    if manifest.is_complete:
        raise ValueError("write_partial_manifest takes a manifest with a partial status; commit_output a complete one")
    _check_parts_present(output, manifest, storage_options)
    write_bytes_atomic(output, MANIFEST_NAME, manifest.to_json().encode("utf-8"), storage_options)


def is_committed(output: str, storage_options: dict | None = None) -> bool:
    """True once _SUCCESS exists."""
    fs, path = resolve(output, storage_options)
    fs.invalidate_cache(path)  # another process may have committed since this one listed
    return fs.exists(join(path, SUCCESS_NAME))


def read_manifest(output: str, storage_options: dict | None = None) -> Manifest:
    fs, path = resolve(output, storage_options)
    try:
        text = fs.cat_file(join(path, MANIFEST_NAME)).decode("utf-8")
    except FileNotFoundError as error:
        raise OutputError(f"{redact(output)}: has no {MANIFEST_NAME}") from error
    try:
        return Manifest.from_json(text)
    except (ValueError, KeyError, TypeError) as error:
        raise OutputError(f"{redact(output)}: {MANIFEST_NAME} is not a valid manifest ({error})") from error


def read_results(output: str, storage_options: dict | None = None, *, partial: bool = False) -> pa.Table:
    """The whole committed result: exactly the manifest's parts, in its order, checksums verified.

    partial=True also reads the manifest of a job that ended unfinished (expired,
    cancelled, failed): the rows of the shards it committed."""
    manifest = _readable_manifest(output, storage_options, partial)
    fs, path = resolve(output, storage_options)
    tables = [_read_part(fs, path, output, part) for part in manifest.parts]
    if not tables:
        return manifest.arrow_schema.empty_table()
    try:
        return pa.concat_tables(tables)
    except pa.ArrowInvalid as error:
        raise OutputError(f"{redact(output)}: parts disagree on their schema ({error})") from error


def read_errors(output: str, storage_options: dict | None = None, *, partial: bool = False) -> list[dict]:
    """The committed output's failed rows, {"id": ..., "error": ...} each, from its errors file."""
    manifest = _readable_manifest(output, storage_options, partial)
    if manifest.errors_file is None:
        raise OutputError(f"{redact(output)}: the job wrote no errors file")
    return read_errors_file(output, manifest.errors_file, storage_options)


def _readable_manifest(output: str, storage_options: dict | None, partial: bool) -> Manifest:
    if is_committed(output, storage_options):
        return read_manifest(output, storage_options)
    if not partial:
        raise OutputError(f"{redact(output)}: has no {SUCCESS_NAME}; the output is not committed")
    manifest = read_manifest(output, storage_options)
    if manifest.is_complete:   # a commit interrupted between its manifest and _SUCCESS
        raise OutputError(f"{redact(output)}: has no {SUCCESS_NAME}; the output is not committed")
    return manifest


def _read_part(fs, path: str, output: str, part: PartInfo) -> pa.Table:
    data = read_listed_file(fs, path, output, part.name, part.sha256)
    table = pq.read_table(pa.BufferReader(data))
    if table.num_rows != part.num_rows:
        raise OutputError(f"{redact(output)}: {part.name} has {table.num_rows} rows, the manifest says {part.num_rows}")
    return table


def _check_parts_present(output: str, manifest: Manifest, storage_options: dict | None) -> None:
    """One listing, not a request per part: every listed file must exist with the size the manifest gives."""
    fs, path = resolve(output, storage_options)
    fs.invalidate_cache(path)
    try:
        sizes = {entry["name"].rstrip("/").rsplit("/", 1)[-1]: entry["size"] for entry in fs.ls(path, detail=True)}
    except FileNotFoundError:
        sizes = {}
    listed = [*manifest.parts, *(file for file in (manifest.errors_file, manifest.top_n_file) if file)]
    wrong = [entry.name for entry in listed if sizes.get(entry.name) != entry.num_bytes]
    if wrong:
        raise OutputError(f"{redact(output)}: cannot commit, parts missing or of the wrong size: {wrong[:10]}"
                          + (f" and {len(wrong) - 10} more" if len(wrong) > 10 else ""))
