"""Retention: a schedule's outputs and cache entries older than its retention go, when
`barge schedule prune` (or `client.schedules.prune`) is run — never on their own.

An output is removed the way `if_exists="replace"` clears one (_SUCCESS first, then
the manifest, errors file and part files; other files stay), and only when its job is
finished and no newer run of the schedule writes to the same folder. A finished job's
staging folder (kept by a job that ended unfinished, for a retry) goes past retention
whatever happens to the output. A cache entry
goes when no job has written or reused it for as long as the longest retention among
the schedules whose jobs share its namespace; a schedule that keeps its outputs for
ever keeps its cache entries too. A cache file left without entries is deleted through
the URL its index row records, and its row goes only then (or once it is gone for every
host, jobs.cache_reach): a file on another host's disk is reported as out of this host's
reach and stays indexed, for a prune on the host that holds it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from jobs.cache_reach import CacheReach, Removal
from jobs.cache_store import CacheFile
from jobs.schedule_store import ScheduleRun
from jobs.schedules import Schedule
from jobs.store import Store
from storage.clear import clear_output
from storage.fs import redact, resolve
from storage.stage import remove_staging, staging_url

log = logging.getLogger("barge.retention")


@dataclass
class PruneReport:
    dry_run: bool
    outputs: list[str] = field(default_factory=list)        # outputs removed (or to remove)
    cache_entries: int = 0
    cache_files: list[str] = field(default_factory=list)    # cache files removed (or to remove)
    cache_files_out_of_reach: list[str] = field(default_factory=list)   # not seen or not deletable from this
                                                                         # host: kept, and their index rows too
    cache_files_gone: list[str] = field(default_factory=list)   # already gone for every host: rows forgotten
    staging: list[str] = field(default_factory=list)        # staging folders of old jobs (storage.stage)

    def lines(self) -> list[str]:
        verb = "would remove" if self.dry_run else "removed"
        unreached = "would not remove" if self.dry_run else "did not remove"
        forgot = "would forget" if self.dry_run else "forgot"
        summary = (f"{verb} {len(self.outputs)} outputs, {self.cache_entries} cache entries, "
                   f"{len(self.cache_files)} cache files, {len(self.staging)} staging folders")
        if self.cache_files_out_of_reach:
            summary += f"; {len(self.cache_files_out_of_reach)} cache files out of this host's reach, kept"
        return ([f"{verb} output {redact(url)}" for url in self.outputs]
                + [f"{verb} staged files {redact(url)}" for url in self.staging]
                + [f"{verb} cache file {redact(url)}" for url in self.cache_files]
                + [f"{forgot} cache file {redact(url)}: already gone" for url in self.cache_files_gone]
                + [f"{unreached} cache file {redact(url)}: not reachable from this host (kept in the index for "
                   "the host that holds it: prune there)" for url in self.cache_files_out_of_reach]
                + [summary])


def prune(store: Store, schedules: list[Schedule], reach: CacheReach, *, dry_run: bool = False,
          now: float | None = None) -> PruneReport:
    """`reach`: what this host may delete or forget of the cache's files (jobs.cache_reach)."""
    now = time.time() if now is None else now
    report = PruneReport(dry_run=dry_run)
    for schedule in schedules:
        if schedule.retention_s is not None:
            _prune_outputs(store, schedule, store.schedule_runs(schedule.id), now - schedule.retention_s, report)
    _prune_cache(store, {s.id for s in schedules}, now, reach, report)
    return report


def _prune_outputs(store: Store, schedule: Schedule, runs: list[ScheduleRun], cutoff: float,
                   report: PruneReport) -> None:
    jobs = {run.job_id: _job(store, run.job_id) for run in runs if run.status == "submitted"}
    kept = {jobs[r.job_id].spec.output for r in runs if r.job_id in jobs and jobs[r.job_id] and r.period_at >= cutoff}
    for run in runs:
        job = jobs.get(run.job_id)
        if job is None or run.pruned_at is not None or run.period_at >= cutoff or not job.status.is_finished:
            continue
        _prune_staging(job, report)   # the job's own folder: it goes with the job's retention, output kept or not
        if job.spec.output in kept:   # a newer run writes there: its result is not old
            continue
        report.outputs.append(job.spec.output)
        if not report.dry_run:
            clear_output(job.spec.output)
            store.mark_run_pruned(run, time.time())
            log.info("schedule %s: removed output %s of job %s", schedule.name, redact(job.spec.output), job.id)


def _prune_staging(job, report: PruneReport) -> None:
    """A job that ended unfinished keeps its staged files for a retry (storage.stage); past
    retention no retry is coming. A committed job's were removed at its commit."""
    url = _remove_staging(job.spec.output, job.id, dry_run=report.dry_run)
    if url is not None:
        report.staging.append(url)


def _remove_staging(output: str, job_id: str, *, dry_run: bool = False) -> str | None:
    """The job's staging folder's URL if it has one, removed unless `dry_run`; None if none."""
    url = staging_url(output, job_id)
    fs, path = resolve(url)
    if not fs.exists(path):
        return None
    if not dry_run:
        remove_staging(output, job_id)
        log.info("removed the staged files of job %s at %s", job_id, redact(url))
    return url


def prune_abandoned_staging(store: Store, retention_s: float, now: float | None = None) -> list[str]:
    """The staged files of jobs that ended unfinished more than `retention_s` ago, removed
    (the housekeeper's, every few minutes; a one-off job is never pruned by a schedule). A
    retry after that still works: a shard whose staged file is gone reads its rows from the
    input (storage.read), only slower. The URLs removed."""
    removed = []
    for job_id, output in store.abandoned_staging(retention_s, now):
        try:
            url = _remove_staging(output, job_id)
        except Exception:   # noqa: BLE001 - storage unreachable or no credentials here: the next pass tries again
            log.warning("job %s: its staged files at %s could not be removed yet", job_id,
                        redact(staging_url(output, job_id)), exc_info=True)
            continue
        if url is not None:
            removed.append(url)
        store.mark_staging_removed(job_id)
    return removed


def _prune_cache(store: Store, schedule_ids: set[str], now: float, reach: CacheReach, report: PruneReport) -> None:
    for namespace, retention_s in _namespace_retention(store).items():
        if retention_s is None or not _used_by(store, namespace, schedule_ids):
            continue
        pruned = store.cache_prune([namespace], now - retention_s, dry_run=report.dry_run)
        report.cache_entries += pruned.entries
        _remove_cache_files(store, pruned.files, reach, report)


def _remove_cache_files(store: Store, files: list[CacheFile], reach: CacheReach, report: PruneReport) -> None:
    """Each file without entries, deleted through its own URL; a row goes only with its file."""
    forgotten: dict[str, str] = {}   # file id -> its URL, removed or gone
    for file in files:
        removal = reach.remove(file.url, dry_run=report.dry_run)
        if removal is Removal.OUT_OF_REACH:
            report.cache_files_out_of_reach.append(file.url)
            continue
        (report.cache_files if removal is Removal.REMOVED else report.cache_files_gone).append(file.url)
        forgotten[file.id] = file.url
    if forgotten and not report.dry_run:
        store.cache_forget_files(forgotten)


def _namespace_retention(store: Store) -> dict[str, float | None]:
    """namespace -> the longest retention among schedules whose jobs use it (None: for ever)."""
    longest: dict[str, float | None] = {}
    for schedule in store.list_schedules():
        for run in store.schedule_runs(schedule.id):
            job = _job(store, run.job_id) if run.status == "submitted" else None
            if job is None or job.cache_namespace is None:
                continue
            current = longest.get(job.cache_namespace, 0.0)
            longest[job.cache_namespace] = (None if current is None or schedule.retention_s is None
                                            else max(current, schedule.retention_s))
    return longest


def _used_by(store: Store, namespace: str, schedule_ids: set[str]) -> bool:
    for schedule_id in schedule_ids:
        for run in store.schedule_runs(schedule_id):
            job = _job(store, run.job_id) if run.status == "submitted" else None
            if job is not None and job.cache_namespace == namespace:
                return True
    return False


def _job(store: Store, job_id: str):
    try:
        return store.get_job(job_id)
    except KeyError:
        return None
