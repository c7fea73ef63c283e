"""The chaos soak's end checks and figures.

Checks, each a line in `SoakReport.failures` when it does not hold:
  - every job SUCCEEDED, or EXPIRED at or after its deadline; none left in a non-final state;
  - every input row exactly once in its job's output (read through the manifest, checksums
    verified; an expired job: exactly the rows of the shards it committed);
  - no stray part: the output's part files are the manifest's, which are the committed shards'
    (an unfinished job's folder may also hold parts of shards it never committed, as
    storage.manifest allows); no staging left behind by a succeeded job;
  - every final event delivered, one per job, the receiver seeing one webhook-id for it;
    every other event delivered too;
  - no worker exited on its own, and every scheduled fault was applied.
Figures: faults by kind, shard re-runs, webhook attempts and redeliveries, re-sends by the
housekeeper, redelivered messages dropped, time lost, rows, shards, minutes.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from jobs.status import JobStatus, ShardStatus
from webhooks.events import FINAL_EVENT_TYPES


@dataclass(frozen=True)
class SoakJob:
    name: str
    job_id: str
    output: str                      # s3://... folder
    expected_ids: range              # the ids of its input rows
    expires_after_s: float | None = None


@dataclass
class SoakReport:
    failures: list[str] = field(default_factory=list)
    figures: dict[str, object] = field(default_factory=dict)
    injected_kinds: set[str] = field(default_factory=set)   # FaultKind values applied at least once
    uncommitted_parts: int = 0   # part files of shards an unfinished job never committed (allowed)

    @property
    def passed(self) -> bool:
        return not self.failures

    def format(self) -> str:
        lines = ["chaos soak figures:"]
        lines += [f"  {name}: {value}" for name, value in self.figures.items()]
        lines.append("checks: " + ("all passed" if self.passed else f"{len(self.failures)} FAILED"))
        lines += [f"  FAIL {failure}" for failure in self.failures]
        return "\n".join(lines)


def check_soak(*, config, client, jobs, s3, pool, injector, proxy, receiver, deployment, elapsed_s: float,
               jobs_done_s: float) -> SoakReport:
    report = SoakReport()
    store = client.store
    shards = {job.job_id: store.list_shards(job.job_id) for job in jobs}
    for job in jobs:
        record = store.get_job(job.job_id)
        _check_end_state(report, job, record)
        if record.status in (JobStatus.SUCCEEDED, JobStatus.EXPIRED):
            _check_output(report, job, record, shards[job.job_id], s3)
    stuck = [f"{j.id} {j.status}" for j in store.list_jobs(limit=1000) if not j.status.is_finished]
    if stuck:
        report.failures.append(f"jobs stuck in a non-final state: {stuck}")
    _check_webhooks(report, jobs, store, receiver)
    for exit_ in pool.unexpected_exits:
        report.failures.append(f"worker {exit_.pid} exited on its own ({exit_.exit_code}): {exit_.last_log_line}")
    report.failures += [f"fault not applied: {error}" for error in injector.errors]
    report.injected_kinds = {fault.fault.kind.value for fault in injector.injected}
    report.figures = _figures(report, config, jobs, store, shards, pool, injector, proxy, receiver, deployment,
                              elapsed_s, jobs_done_s)
    return report


def _check_end_state(report: SoakReport, job: SoakJob, record) -> None:
    if record.status == JobStatus.SUCCEEDED:
        return
    if record.status == JobStatus.EXPIRED and job.expires_after_s is not None:
        if record.finished_at + 1 < record.created_at + job.expires_after_s:
            report.failures.append(f"{job.name}: expired {record.finished_at - record.created_at:.0f}s after "
                                   f"submission, before its deadline of {job.expires_after_s:.0f}s")
        return
    report.failures.append(f"{job.name}: ended {record.status}: {record.error}")


def _check_output(report: SoakReport, job: SoakJob, record, shards, s3) -> None:
    import s3fs
    from storage.manifest import read_manifest, read_results
    options = s3.storage_options   # straight to the server: the proxy's faults are over
    partial = record.status != JobStatus.SUCCEEDED
    committed = {s.part["name"] for s in shards if s.status == ShardStatus.COMMITTED}
    try:
        manifest = read_manifest(job.output, options)
        ids = read_results(job.output, options, partial=partial).column("doc_id").to_pylist()
    except Exception as error:
        report.failures.append(f"{job.name}: output unreadable: {error}")
        return
    listed = [part.name for part in manifest.parts]
    if len(set(ids)) != len(ids):
        report.failures.append(f"{job.name}: {len(ids) - len(set(ids))} duplicated rows")
    expected = set(job.expected_ids) if not partial else _committed_ids(shards)
    if set(ids) != expected:
        report.failures.append(f"{job.name}: {len(expected - set(ids))} rows lost, "
                               f"{len(set(ids) - expected)} rows that are not its input's")
    if set(listed) != committed or len(listed) != len(committed):
        report.failures.append(f"{job.name}: the manifest lists {len(listed)} parts, {len(committed)} shards committed")
    fs = s3fs.S3FileSystem(**options)
    folder = job.output.removeprefix("s3://").rstrip("/")
    files = {path.rsplit("/", 1)[1] for path in fs.glob(f"{folder}/part-*.parquet")}
    # An unfinished job's folder may also hold the parts of shards that never committed
    # (storage.manifest's NOTE: the manifest, not a listing, is the result); any other
    # file, or a listed part missing, is a stray.
    uncommitted = {_part_name(s) for s in shards if s.status != ShardStatus.COMMITTED} if partial else set()
    strays = files - set(listed) - uncommitted
    if strays or set(listed) - files:
        report.failures.append(f"{job.name}: stray part files {sorted(strays)[:5]}, "
                               f"missing {sorted(set(listed) - files)[:5]}")
    report.uncommitted_parts += len(files & uncommitted)
    if not partial and fs.exists(f"{folder}/_barge_staging"):
        report.failures.append(f"{job.name}: staging left behind")


def _part_name(shard) -> str:
    from storage.plan import ShardPlan
    from storage.write import part_name
    return part_name(ShardPlan.from_dict(shard.plan))


def _committed_ids(shards) -> set[int]:
    """The ids of the committed shards' rows, from their plans: a row's id is its position
    in the job's input (the soak's corpus numbers its rows so)."""
    ids: set[int] = set()
    for shard in shards:
        if shard.status == ShardStatus.COMMITTED:
            for piece in shard.plan["pieces"]:
                ids.update(range(piece["global_row_start"], piece["global_row_start"] + piece["num_rows"]))
    return ids


def _check_webhooks(report: SoakReport, jobs, store, receiver) -> None:
    from jobs.outbox import DELIVERED
    job_ids = {job.job_id: job.name for job in jobs}
    events = [e for e in store.outbox.events() if e.job_id in job_ids]
    received: dict[str, set[str]] = {}   # job id -> webhook-ids of the final events it received
    for delivery in receiver.deliveries:
        payload = json.loads(delivery.body)
        if payload["type"] in FINAL_EVENT_TYPES:
            received.setdefault(payload["data"]["job_id"], set()).add(delivery.headers["webhook-id"])
    accepted = {d.headers["webhook-id"] for d in receiver.accepted()}
    for job_id, name in job_ids.items():
        finals = [e for e in events if e.job_id == job_id and e.type in FINAL_EVENT_TYPES]
        if len(finals) != 1 or finals[0].status != DELIVERED:
            report.failures.append(f"{name}: final events {[(e.type, e.status) for e in finals]}, not one delivered")
            continue
        if received.get(job_id) != {finals[0].id} or finals[0].id not in accepted:
            report.failures.append(f"{name}: the receiver saw final webhook-ids {received.get(job_id)}, "
                                   f"accepted {finals[0].id in accepted}, for the one event {finals[0].id}")
    undelivered = [(job_ids[e.job_id], e.type, e.status) for e in events if e.status != DELIVERED]
    if undelivered:
        report.failures.append(f"events not delivered: {undelivered[:10]}")


def _figures(report, config, jobs, store, shards, pool, injector, proxy, receiver, deployment, elapsed_s, jobs_done_s):
    from tests.support.faulty_proxy import Fault
    all_shards = [s for job_shards in shards.values() for s in job_shards]
    injected = Counter(f.fault.kind.value for f in injector.injected)
    outage_s = Counter()
    for fault in injector.injected:
        outage_s[fault.fault.kind.value] += fault.lasted_s if fault.fault.duration_s else 0.0
    events = [e for e in store.outbox.events() if e.job_id in {job.job_id for job in jobs}]
    ids = [d.headers["webhook-id"] for d in receiver.accepted()]
    logs = "".join(open(p.log_path, errors="replace").read() for p in deployment.workers)
    rerun_rows = sum((s.attempt - 1) * s.num_rows for s in all_shards if s.attempt > 1)
    return {
        "seed": config.seed, "broker": config.broker, "workers": config.num_workers,
        "rows": f"{sum(len(job.expected_ids) for job in jobs):,} over {len(jobs)} jobs "
                f"(corpus {config.num_rows:,} rows in {config.num_files} files)",
        "shards": len(all_shards),
        "uncommitted parts in unfinished outputs": report.uncommitted_parts,
        "jobs": ", ".join(f"{job.name} {store.get_job(job.job_id).status}" for job in jobs),
        "minutes": f"{elapsed_s / 60:.1f} (jobs final after {jobs_done_s / 60:.1f})",
        "faults injected": f"{sum(injected.values())} of {injector.num_scheduled()} scheduled: "
                           + ", ".join(f"{kind} {count}" for kind, count in sorted(injected.items())),
        "S3 requests faulted": f"503 {len(proxy.faults(Fault.SLOWDOWN))}, dropped {len(proxy.faults(Fault.DROP))} "
                               f"of {len(proxy.log):,}",
        "outage seconds": ", ".join(f"{kind} {seconds:.0f}" for kind, seconds in sorted(outage_s.items()) if seconds),
        "shard re-runs": f"{sum(max(0, s.attempt - 1) for s in all_shards)} "
                         f"({rerun_rows:,} rows computed again; max attempts of a shard "
                         f"{max((s.attempt for s in all_shards), default=0)})",
        "housekeeper re-sends": logs.count("sending it again"),
        "redelivered shard messages dropped": logs.count(": dropped (finished, held by a live worker"),
        "webhook events": f"{len(events)}, {sum(e.attempts for e in events)} attempts; receiver got "
                          f"{len(receiver.deliveries)} requests, accepted {len(ids)}, "
                          f"redeliveries of an accepted id {len(ids) - len(set(ids))}",
        "time lost": f"worker slots down {pool.downtime_s():.0f} s over {len(pool.interruptions)} kills/drains",
        "unexpected worker exits": len(pool.unexpected_exits),
        "failed worker starts": f"{len(pool.failed_starts)}"
                                + (f" (last: {pool.failed_starts[-1].last_log_line[:160]})" if pool.failed_starts else ""),
    }
