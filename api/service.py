"""What the API's routes do, without HTTP: files and batches of one API key, over the
job system's client. A batch is a job: create validates the input file and submits a
job through `jobs.Client`, cancel cancels it, and reading a batch whose job has ended
writes the batch's output and error files once (`settle`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from dataclasses import dataclass
from typing import BinaryIO

from api.batch_adapters import lora_module_bases, lora_modules, served_adapters
from api.batch_input import ENDPOINT_MODES, MAX_REQUESTS, LineError, completion_window_s, parse_batch
from api.batch_output import batch_output, job_errors
from api.batch_store import batch_folder, read_requests, write_requests
from api.batch_view import batch_object
from api.errors import ApiError, not_found
from api.upload import checked_chunks
from jobs.api_batches import ApiBatches, BatchRecord, is_batch_id, new_batch_id, owes_partial_manifest
from jobs.api_files import ApiFiles, FileRecord
from jobs.client import Client
from jobs.models import embedding_width, is_model, model_modes, registered_models
from jobs.records import JobProgress
from jobs.spec import JobSpec, JobSpecError
from jobs.status import JobStatus
from jobs.failpoints import failpoint
from storage.fs import join
from storage.errors import StorageError
from storage.manifest import read_results
from storage.redaction import redact_text, redact_url

log = logging.getLogger("barge.api")

MAX_METADATA_PAIRS = 16
# metadata keys with a meaning: a webhook for the batch's job (its final event, signed as
# every Barge webhook), and the secret to verify it, answered once by create
WEBHOOK_URL_KEY = "webhook_url"
WEBHOOK_SECRET_KEY = "webhook_secret"


@dataclass(frozen=True)
class ApiSettings:
    files_url: str                 # where uploaded and written files, batch inputs and outputs live
    max_file_bytes: int = 200 * 1024 * 1024     # as OpenAI
    rows_per_shard: int = 256      # a batch's job: rows per shard (smaller: earlier partial results)
    orphan_after_s: float = 600.0  # a batch whose job is still not made this long after it was recorded never gets one


class BatchService:
    def __init__(self, client: Client, settings: ApiSettings):
        self.client = client
        self.settings = settings
        self.files = ApiFiles(client.store.engine, settings.files_url)
        self.batches = ApiBatches(client.store.engine)
        self.known_models = served_models()
        self.embedding_widths = served_widths(self.known_models)
        self.lora_modules = lora_modules()   # adapter name -> location: what a line may name as BASE:ADAPTER
        self.lora_bases = lora_module_bases()   # adapter name -> its base, where its entry names one

    # -- files -----------------------------------------------------------------------------

    def upload(self, key_id: str, purpose: str, filename: str, source: BinaryIO) -> FileRecord:
        """The uploaded file copied to storage in chunks, its size and line limits checked
        on the way (api.upload): never held in memory whole."""
        if purpose != "batch":
            raise ApiError(400, f"purpose {purpose!r} is not supported; this server takes \"batch\"", param="purpose")
        chunks = checked_chunks(source, self.settings.max_file_bytes, MAX_REQUESTS)
        return self.files.create(key_id, purpose, filename, chunks)

    def file(self, key_id: str, file_id: str) -> FileRecord:
        record = self.files.get(key_id, file_id)
        if record is None:
            raise not_found("file", file_id)
        return record

    # -- batches ---------------------------------------------------------------------------

    def create(self, key_id: str, input_file_id: str, endpoint: str, window: str, metadata: dict | None) -> dict:
        if endpoint not in ENDPOINT_MODES:
            raise ApiError(400, f"endpoint {endpoint!r} is not supported; one of {', '.join(ENDPOINT_MODES)}",
                           param="endpoint")
        window_s = completion_window_s(window)
        if window_s is None:
            raise ApiError(400, f"completion_window {window!r} is not supported; \"24h\" (or a shorter \"<n>h\", "
                                "\"<n>m\", \"<n>s\")", param="completion_window")
        _check_metadata(metadata)
        source = self.files.get(key_id, input_file_id)
        if source is None or source.purpose != "batch":
            raise not_found("file", input_file_id, param="input_file_id")
        batch_id = new_batch_id()
        # the adapters a line names are checked once per batch: one retrained since is checked again
        adapters = served_adapters(self.client.settings, locations=self.lora_modules, bases=self.lora_bases)
        parsed = parse_batch(self.files.content(source), endpoint, self.known_models, self.embedding_widths, adapters)
        record = BatchRecord(id=batch_id, key_id=key_id, job_id=None, endpoint=endpoint, model=None,
                             input_file_id=input_file_id, completion_window=window, metadata=metadata or {},
                             created_at=time.time())
        if isinstance(parsed, list):   # refused: failed at once, as OpenAI's validation, no job
            return self._refused(record, parsed, window_s)
        # The batch is recorded first, naming the job it is about to make: a server killed in
        # between leaves a batch whose job never came, which its next read settles as failed
        # (_view), never a job that no batch names and nobody reads.
        spec = self._spec(batch_id, key_id, parsed, window_s, metadata or {})
        record = self.batches.create(_replace(record, job_id=uuid.uuid4().hex, model=parsed.model,
                                              num_requests=parsed.num_lines))
        failpoint("after_batch_record")
        try:
            job = self.client.submit(spec, job_id=record.job_id)
        except JobSpecError as error:
            self.batches.discard(batch_id)
            raise ApiError(400, str(error), param=_param(error)) from None
        created = batch_object(record, self.client.store.progress(job.id), window_s)
        if job.webhook_secret:   # shown once, in this answer only, as `barge submit` prints it
            created["metadata"] = {**(created["metadata"] or {}), WEBHOOK_SECRET_KEY: job.webhook_secret}
        return created

    def get(self, key_id: str, batch_id: str) -> dict:
        return self._view(self._record(key_id, batch_id))

    def list(self, key_id: str, after: str | None, limit: int) -> tuple[list[dict], bool]:
        if after is not None and not is_batch_id(after):
            raise not_found("batch", after, param="after")
        records, has_more = self.batches.list(key_id, after=after, limit=limit)
        return [self._view(record) for record in records], has_more

    def cancel(self, key_id: str, batch_id: str) -> dict:
        record = self._record(key_id, batch_id)
        if record.job_id is None or record.settled_at is not None:
            raise ApiError(409, f"batch {batch_id} is already final; it cannot be cancelled", code="batch_not_cancellable")
        self.batches.mark_cancelling(batch_id)
        self.client.job(record.job_id).cancel()   # False: it ended meanwhile, and reads as it ended
        return self._view(self._record(key_id, batch_id))

    # -- inside ----------------------------------------------------------------------------

    def _record(self, key_id: str, batch_id: str) -> BatchRecord:
        record = self.batches.get(key_id, batch_id)
        if record is None:
            raise not_found("batch", batch_id)
        return record

    def _refused(self, record: BatchRecord, errors: list[LineError], window_s: int) -> dict:
        record = _replace(record, errors=[error.to_dict() for error in errors], settled_at=record.created_at)
        self.batches.create(record)
        return batch_object(record, None, window_s)

    def _spec(self, batch_id: str, key_id: str, parsed, window_s: int, metadata: dict) -> JobSpec:
        """The batch's job, its requests written; a webhook for it when `metadata` names a `webhook_url`."""
        folder = batch_folder(self.settings.files_url, batch_id)
        try:
            return JobSpec(mode=ENDPOINT_MODES[parsed.endpoint], model=parsed.model,
                           input=write_requests(folder, parsed), output=join(folder, "output"), input_column="input",
                           params=parsed.params, metadata={**metadata, "openai_batch_id": batch_id, "api_key_id": key_id},
                           expires_after_s=float(window_s), max_rows_per_shard=self.settings.rows_per_shard,
                           webhook_url=metadata.get(WEBHOOK_URL_KEY))
        except JobSpecError as error:
            raise ApiError(400, str(error), param=_param(error)) from None

    def _view(self, record: BatchRecord) -> dict:
        window_s = completion_window_s(record.completion_window)
        if record.job_id is None:
            return batch_object(record, None, window_s)
        try:
            job = self.client.store.progress(record.job_id)
        except KeyError:   # its job is being made, or never was (the server stopped in between)
            return batch_object(self._settle_orphan(record), None, window_s)
        if job.is_finished and record.settled_at is None and self._settle(record, job):
            record = self.batches.get(record.key_id, record.id)
        return batch_object(record, job, window_s)

    def _settle_orphan(self, record: BatchRecord) -> BatchRecord:
        """A batch whose job is not there `orphan_after_s` after it was recorded never gets
        one: failed, with no request run (a create still under way is given that long)."""
        if record.settled_at is not None or time.time() - record.created_at < self.settings.orphan_after_s:
            return record
        error = {"code": "batch_failed", "message": "The server stopped while creating this batch; no request ran. "
                                                     "Create it again.", "param": None, "line": None}
        self.batches.settle(record.id, output_file_id=None, error_file_id=None, num_completed=0, num_failed=0,
                            errors=[error])
        return self.batches.get(record.key_id, record.id)

    def _settle(self, record: BatchRecord, job: JobProgress) -> bool:
        """Write the output and error files of an ended job's batch; False while its
        partial manifest is still owed (then a later read settles it). A failed job's
        error, redacted, becomes the batch's `errors` and each unrun line's reason: the
        worker that failed it may be on another host, its log out of the caller's reach."""
        status = job.status
        if status != JobStatus.SUCCEEDED and owes_partial_manifest(self.client.store.engine, record.job_id):
            return False
        reason = redact_text(job.error) if status == JobStatus.FAILED else None
        folder = batch_folder(self.settings.files_url, record.id)
        requests = read_requests(folder)
        results: list[dict | None] = [None] * len(requests.row_lines)
        for row in _job_rows(join(folder, "output"), status):
            results[row["row_index"]] = row
        made = batch_output(record.endpoint, record.model, requests, results, str(status), reason)
        output = self._write_output(record, "output", made.output_lines)
        errors = self._write_output(record, "errors", made.error_lines)
        if not self.batches.settle(record.id, output_file_id=output, error_file_id=errors,
                                   num_completed=made.num_completed, num_failed=made.num_failed,
                                   usage={"input_tokens": made.input_tokens, "output_tokens": made.output_tokens},
                                   errors=job_errors(reason) if status == JobStatus.FAILED else None):
            for file_id in (output, errors):   # another reader settled it first: its files stand
                if file_id is not None:
                    self.files.delete(record.key_id, file_id)
        return True

    def _write_output(self, record: BatchRecord, kind: str, lines: list[str]) -> str | None:
        if not lines:
            return None
        data = "".join(line + "\n" for line in lines).encode()
        return self.files.create(record.key_id, "batch_output", f"{record.id}_{kind}.jsonl", data).id


def _job_rows(output: str, status: JobStatus) -> list[dict]:
    """The job's output rows; none for a job that ended before it committed anything."""
    try:
        return read_results(output, partial=status != JobStatus.SUCCEEDED).to_pylist()
    except (StorageError, OSError, ValueError) as error:
        if status == JobStatus.SUCCEEDED:
            raise
        log.info("%s: no committed rows (%s)", redact_url(output), redact_text(str(error)))
        return []


def served_models() -> dict[str, tuple[str, ...]]:
    """Registered model name -> the modes it serves (jobs.models.model_modes: an embed or
    generate model also scores pairs); a model path is never taken from a request."""
    known = {}
    for name, path in registered_models().items():
        if not is_model(path):   # not there on this machine (yet): not served (model_mode knows a .gguf by name)
            continue
        try:
            known[name] = model_modes(path)
        except (OSError, ValueError):   # an unreadable config.json: not served
            continue
    return known


def served_widths(known_models: dict[str, tuple[str, ...]]) -> dict[str, int]:
    """Served embed model name -> its vector length, the most `dimensions` a line may ask."""
    paths = registered_models()
    widths = {name: embedding_width(paths[name]) for name, modes in known_models.items() if "embed" in modes}
    return {name: width for name, width in widths.items() if width is not None}


def _check_metadata(metadata: object) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, dict) or len(metadata) > MAX_METADATA_PAIRS or not all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512 for k, v in metadata.items()):
        raise ApiError(400, "metadata must be at most 16 string pairs, keys up to 64 and values up to 512 characters",
                       param="metadata")
    if WEBHOOK_SECRET_KEY in metadata:
        raise ApiError(400, f"metadata.{WEBHOOK_SECRET_KEY} is made by the server and answered once; do not send one",
                       param=f"metadata.{WEBHOOK_SECRET_KEY}")


def _param(error: JobSpecError) -> str | None:
    return f"metadata.{WEBHOOK_URL_KEY}" if error.field == "webhook_url" else None


def _replace(record: BatchRecord, **changes) -> BatchRecord:
    return dataclasses.replace(record, **changes)
