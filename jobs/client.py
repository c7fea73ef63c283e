"""The Python client: submit a JobSpec, then follow, cancel or read the Job.

    client = Client()                  # BARGE_DATABASE_URL / BARGE_BROKER_URL, else embedded
    job = client.submit(JobSpec(...))  # validated and checked against the data first
    job.wait(progress=True)
    table = job.results()
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import pyarrow as pa

from jobs.adapters import adapter_identity, pin_adapter
from jobs.cache_keys import cache_namespace, model_identity
from jobs.events import final_event
from jobs.failpoints import failpoint
from jobs.hosts import check_job_locations
from jobs.inspection import keep_inspection
from jobs.job_list import JobList, JobPage
from jobs.model_cards import submit_model
from jobs.models import ModelRef
from jobs.messaging import CONTROL_QUEUE, PLAN_JOB, RESUME_JOB, WRITE_PARTIAL_OUTPUT, celery_app, queue_name
from jobs.private_files import tighten_data_dir
from jobs.records import JobProgress
from jobs.schedule_client import Schedules
from jobs.settings import Settings
from jobs.spec import JobSpec
from jobs.status import JobStatus
from jobs.store import Store
from jobs.throughput import format_duration, format_rate
from jobs.transient import is_transient
from jobs.validate import check_job, encoded_schema
from storage.manifest import read_errors, read_results
from storage.redaction import redact_text
from webhooks.signing import generate_secret

log = logging.getLogger("barge.client")

# Final states whose manifest lists the shards they committed (queueing.finalize).
PARTIAL_RESULT_STATES = (JobStatus.EXPIRED, JobStatus.CANCELLED, JobStatus.FAILED)


class JobFailed(RuntimeError):
    """Raised by `Job.results()` for a job that did not succeed."""


class Client:
    def __init__(self, *, database_url: str | None = None, broker_url: str | None = None,
                 settings: Settings | None = None):
        settings = settings or Settings.from_env()
        if database_url:
            settings = replace(settings, database_url=database_url)
        if broker_url:
            settings = replace(settings, broker_url=broker_url)
        self.settings = settings
        tighten_data_dir(settings.data_dir)
        self.store = Store(settings.database_url)
        self.store.migrate()
        self._app = None

    @property
    def schedules(self) -> Schedules:
        """Recurring runs: client.schedules.add(...), .list(), .pause(name), ..."""
        return Schedules(self)

    def submit(self, spec: JobSpec, *, webhook_secret: str | None = None, job_id: str | None = None) -> "Job":
        """Check the job against its data, record it, queue its planning. A refused job
        raises `JobSpecError` naming the field, and nothing is queued. A given `job_id`
        that exists already raises sqlalchemy's IntegrityError (schedules rely on it)."""
        if spec.adapter is not None:   # a Hub id: the job stores hf://org/name@<commit>, for every worker
            spec = replace(spec, adapter=pin_adapter(spec.adapter))
        check_job_locations(spec, self.settings)   # many hosts: nothing on this host's disk alone (jobs.hosts)
        checked = check_job(spec, self.resolve_model, self.settings.max_lora_rank)
        if checked.model.pinned:   # a Hub id: the job stores the commit it resolved to now, for every worker
            spec = replace(spec, model=checked.model.pinned)
        secret = (webhook_secret or generate_secret()) if spec.webhook_url else None
        namespace = (cache_namespace(spec, model_identity(checked.model),
                                     adapter_identity(spec.adapter) if spec.adapter else None)
                     if spec.incremental else None)
        job_id = self.store.create_job(spec, model_key=checked.model.key, rows_total=checked.input.num_rows,
                                       output_schema=encoded_schema(checked), webhook_secret=secret,
                                       job_id=job_id, cache_namespace=namespace)
        keep_inspection(spec, job_id, checked.input)   # for planning: footers and small files read once
        try:
            failpoint("after_submit_record")
            self.plan(job_id)
        except Exception as error:   # recorded is submitted: a worker's housekeeper sends the plan task
            if not is_transient(error):
                raise
            log.warning("job %s is recorded but its plan task could not be sent (%s); a worker sends it within "
                        "BARGE_REQUEUE_AFTER_S", job_id, redact_text(str(error)))
        return Job(self, job_id, webhook_secret=secret)

    def resolve_model(self, name: str) -> ModelRef:
        """A model as a submit here checks it: registered on this host, else announced by a
        worker (jobs.model_cards: a name registered on the workers alone), else a folder or Hub id."""
        return submit_model(name, self.store.engine, self.settings.data_dir / "model-cards")

    def plan(self, job_id: str) -> None:
        """Queue a QUEUED job's planning (again: planning a job twice plans it once)."""
        self._send(PLAN_JOB, [job_id])

    def retry(self, job: "Job | str") -> "Job":
        """Re-run only the failed or cancelled shards of a failed, cancelled or expired
        job (a job that never got planned is planned afresh). Committed parts stay."""
        job_id = job.id if isinstance(job, Job) else job
        status = self.store.retry_job(job_id)
        self._send(RESUME_JOB if status == JobStatus.RUNNING else PLAN_JOB, [job_id])
        return Job(self, job_id)

    def job(self, job_id: str) -> "Job":
        self.store.get_job(job_id)   # KeyError for an unknown id
        return Job(self, job_id)

    def jobs(self, limit: int = 50, *, before: str | None = None, status: JobStatus | None = None) -> list[JobProgress]:
        """The newest `limit` jobs (older than the job `before`; in `status`), with their progress."""
        return self.job_page(limit, before=before, status=status).jobs

    def job_page(self, limit: int = 50, *, before: str | None = None, status: JobStatus | None = None) -> JobPage:
        """As `jobs`, and the cursor of the next, older page: two queries whatever the history
        (jobs.job_list). KeyError for a `before` that names no job."""
        return JobList(self.store.engine).page(limit=limit, before=before, status=status)

    def _send(self, task_name: str, args: list) -> None:
        """Send a control task (jobs.messaging) to this deployment's control queue."""
        if self._app is None:
            self._app = celery_app(self.settings)
        self._app.send_task(task_name, args=args, queue=queue_name(self.settings.namespace, CONTROL_QUEUE))


class Job:
    def __init__(self, client: Client, job_id: str, *, webhook_secret: str | None = None):
        self.client = client
        self.id = job_id
        # Known only to the submitter: it is returned once, at submission, never by status().
        self.webhook_secret = webhook_secret

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def status(self) -> JobProgress:
        return self.client.store.progress(self.id)

    def wait(self, timeout: float | None = None, *, progress: bool = False, poll_s: float = 0.5) -> JobProgress:
        """Block until the job is finished; TimeoutError after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = _progress_bar(self.status()) if progress else None
        try:
            while True:
                state = self.status()
                if bar is not None:
                    bar.total = state.rows_total
                    bar.update(state.rows_done - bar.n)
                    bar.set_postfix_str(progress_postfix(state), refresh=False)
                if state.is_finished:
                    return state
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"job {self.id} still {state.status} after {timeout}s")
                time.sleep(poll_s)
        finally:
            if bar is not None:
                bar.close()

    def cancel(self) -> bool:
        """Cancel the job; False if it had already finished. Shards not yet committed are
        dropped; a worker running one finds its claim gone and commits nothing."""
        store = self.client.store
        event = final_event(store, self.id, JobStatus.CANCELLED, None)
        if not store.finish_job(self.id, JobStatus.CANCELLED, event=event):
            return False
        self.client._send(WRITE_PARTIAL_OUTPUT, [self.id])   # list what it finished
        return True

    def errors(self, partial: bool = False) -> list[dict]:
        """The failed rows of a succeeded job, {"id": ..., "error": ...} each (errors.jsonl);
        partial=True: those of the shards an expired, cancelled or failed job committed."""
        return read_errors(self._readable_output(partial), partial=partial)

    def rotate_webhook_secret(self, overlap_s: float = 86_400.0) -> str:
        """Give the job a new webhook secret and return it (shown once). For `overlap_s`
        seconds deliveries are signed with both, so receivers can switch at leisure."""
        secret = generate_secret()
        self.client.store.rotate_webhook_secret(self.id, secret, overlap_s)
        self.webhook_secret = secret
        return secret

    def results(self, partial: bool = False) -> pa.Table:
        """A succeeded job's whole result. partial=True: also the rows an expired,
        cancelled or failed job finished (the shards it committed), as its manifest lists."""
        return read_results(self._readable_output(partial), partial=partial)

    def _readable_output(self, partial: bool) -> str:
        state = self.status()
        if state.status == JobStatus.SUCCEEDED or (partial and state.status in PARTIAL_RESULT_STATES):
            return state.output
        hint = " (results(partial=True) reads the rows it finished)" if state.status in PARTIAL_RESULT_STATES else ""
        raise JobFailed(f"job {self.id} is {state.status}" + (f": {state.error}" if state.error else "") + hint)


def progress_postfix(state: JobProgress) -> str:
    """The bar's text after the counts: status, the job's recent rates, ETA, failed rows."""
    t = state.throughput
    parts = [str(state.status)]
    if t is not None:
        parts += [format_rate(t.recent_rows_per_s or t.rows_per_s, "rows"),
                  format_rate(t.recent_tokens_per_s or t.tokens_per_s, "tok")]
        if not state.is_finished:
            parts.append(f"ETA {format_duration(t.eta_s)}")
    parts.append(f"failed {state.rows_failed}")
    return ", ".join(parts)


def _progress_bar(state: JobProgress):
    from tqdm import tqdm
    # The rate and ETA are the job's own (from its committed shards, over all workers),
    # not tqdm's estimate from when this client happened to look.
    return tqdm(total=state.rows_total, unit="row", desc=f"job {state.job_id[:8]}", dynamic_ncols=True,
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]",
                disable=None)   # None: shown on a terminal only
