"""The SQL tables behind the store. Times are UTC epoch seconds (portable across
SQLite and PostgreSQL); the migrations in `jobs/migrations` create exactly these."""

from __future__ import annotations

from sqlalchemy import (BigInteger, Boolean, Column, Float, ForeignKey, Integer, MetaData, String, Table, Text,
                        PrimaryKeyConstraint, Index)

metadata = MetaData()

jobs = Table(
    "barge_jobs", metadata,
    Column("id", String(32), primary_key=True),
    Column("status", Integer, nullable=False),           # jobs.status.JobStatus
    Column("mode", String(16), nullable=False),
    Column("model_key", String(200), nullable=False),    # routing key (jobs.models.ModelRef.key)
    Column("spec", Text, nullable=False),                # JobSpec as JSON
    Column("webhook_secret", Text),                      # encrypted (jobs.secret_box); never returned by status calls
    Column("webhook_secret_previous", Text),             # during a rotation: also signed with, until...
    Column("webhook_secret_previous_until", Float),
    Column("rows_total", Integer, nullable=False),
    Column("output_schema", Text, nullable=False),       # storage.manifest.encode_schema of the parts' schema
    Column("error", Text),
    Column("created_at", Float, nullable=False),
    Column("started_at", Float),
    Column("finished_at", Float),
    Column("updated_at", Float, nullable=False),
    Column("expires_at", Float),                         # created_at + spec.expires_after_s, if set
    Column("cache_namespace", String(64)),               # incremental jobs: jobs.cache_keys.cache_namespace
    Column("quant_check", Text),                         # FP8 check as JSON (engine.quant.compare.QuantCheck)
    Column("partial_output_sent_at", Float),             # ended unfinished: its partial manifest is owed; when
                                                         # the task that writes it was last sent (NULL: none owed)
    Column("task_sent_at", Float),                       # QUEUED, RUNNING with all shards done, FINALIZING: when the
                                                         # task that moves it on (plan, finalize) was last sent or began
    Column("staging_removed_at", Float),                 # ended unfinished: its staged files removed past retention
                                                         # (jobs.retention.prune_abandoned_staging; 0017)
    Column("stalled_notified_at", Float),                # its job.stalled webhook event written (jobs.unserved; 0018)
    Index("ix_barge_jobs_expires_at", "expires_at"),
    Index("ix_barge_jobs_created", "created_at", "id"),                  # listings' keyset (jobs.job_list)
    Index("ix_barge_jobs_status_created", "status", "created_at", "id"),  # the same, filtered by status
)

shards = Table(
    "barge_shards", metadata,
    Column("job_id", String(32), ForeignKey("barge_jobs.id", ondelete="CASCADE"), nullable=False),
    Column("shard_index", Integer, nullable=False),
    Column("plan", Text, nullable=False),                # storage.plan.ShardPlan as JSON
    Column("num_rows", Integer, nullable=False),
    Column("status", Integer, nullable=False),           # jobs.status.ShardStatus
    Column("attempt", Integer, nullable=False, default=0),
    Column("token", String(32)),                         # current attempt's fencing token
    Column("part", Text),                                # storage.write.PartInfo as JSON, once committed
    Column("rows_succeeded", Integer, nullable=False, default=0),
    Column("rows_failed", Integer, nullable=False, default=0),
    Column("error", Text),
    Column("started_at", Float),
    Column("finished_at", Float),
    Column("updated_at", Float, nullable=False),
    Column("worker_id", String(200)),                    # the worker holding the current attempt
    Column("lease_expires_at", Float),                   # RUNNING: the holder renews it while working
    Column("queued_at", Float),                          # last sent to the broker; NULL: not yet (window)
    Column("num_tokens", BigInteger, nullable=False, default=0, server_default="0"),  # tokens processed, at commit
    Column("device", String(16)),                        # device type that committed it: cpu | cuda | mps
    Column("engine", Text),                              # that engine's settings as JSON (queueing.usage)
    Column("rows_reused", Integer, nullable=False, default=0, server_default="0"),  # incremental: from the cache
    Column("generate_usage", Text),                      # generate: prefill and rows per adapter as JSON
                                                         # (jobs.generate_usage; 0020); NULL: other modes, older shards
    PrimaryKeyConstraint("job_id", "shard_index"),
    Index("ix_barge_shards_lease", "status", "lease_expires_at"),
    Index("ix_barge_shards_finished", "job_id", "finished_at"),
)

webhook_events = Table(
    "barge_webhook_events", metadata,
    Column("id", String(40), primary_key=True),          # webhook-id header ("msg_...")
    Column("job_id", String(32), ForeignKey("barge_jobs.id", ondelete="CASCADE"), nullable=False),
    Column("type", String(40), nullable=False),
    Column("url", Text, nullable=False),
    Column("body", Text, nullable=False),                # exact bytes that are signed and sent
    Column("status", String(16), nullable=False),        # pending | delivered | failed | disabled
    Column("attempts", Integer, nullable=False, default=0),   # attempts started, replays included
    Column("retry_from", Integer, nullable=False, default=0),  # `attempts` when last replayed
    Column("next_attempt_at", Float, nullable=False),
    Column("claimed_until", Float, nullable=False, default=0.0),
    Column("last_status_code", Integer),
    Column("last_error", Text),
    Column("created_at", Float, nullable=False),
    Column("delivered_at", Float),
    Index("ix_barge_webhook_events_due", "status", "next_attempt_at"),
)

webhook_attempts = Table(
    "barge_webhook_attempts", metadata,
    Column("event_id", String(40), ForeignKey("barge_webhook_events.id", ondelete="CASCADE"), nullable=False),
    Column("attempt", Integer, nullable=False),          # 1, 2, ... over the event's life
    Column("started_at", Float, nullable=False),         # written when the attempt is claimed
    Column("finished_at", Float),                        # None: the dispatcher died mid-attempt
    Column("status_code", Integer),                      # None: no HTTP answer
    Column("latency_s", Float),
    Column("error", Text),                               # never contains the secret
    PrimaryKeyConstraint("event_id", "attempt"),
)

webhook_endpoints = Table(
    "barge_webhook_endpoints", metadata,
    Column("url", Text, primary_key=True),
    Column("disabled_at", Float),                        # None: enabled (an operator re-enabled it)
    Column("disabled_reason", Text),
    Column("updated_at", Float, nullable=False),
)

schedules = Table(
    "barge_schedules", metadata,
    Column("id", String(32), primary_key=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("cron", String(200), nullable=False),         # five fields, in `timezone`
    Column("timezone", String(64), nullable=False),      # IANA name, e.g. Europe/Paris
    Column("template", Text, nullable=False),            # JobSpec fields as JSON, placeholders unrendered
    Column("is_enabled", Boolean, nullable=False),
    Column("catchup", String(8), nullable=False),        # skip | latest | all (jobs.schedules.CATCHUP)
    Column("retention_s", Float),                        # None: keep outputs and cache entries
    Column("webhook_secret", Text),                      # encrypted; signs every run's job's webhooks; never listed
    Column("next_run_at", Float, nullable=False),        # cursor: first fire time not yet handled
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)

schedule_runs = Table(
    "barge_schedule_runs", metadata,
    Column("schedule_id", String(32), ForeignKey("barge_schedules.id", ondelete="CASCADE"), nullable=False),
    Column("period_at", Float, nullable=False),          # the fire time (UTC epoch) this run is for
    Column("kind", String(12), nullable=False),          # scheduled | manual
    Column("job_id", String(32), nullable=False),        # decided up front: one job per period
    Column("status", String(12), nullable=False),        # pending | submitted | refused
    Column("error", Text),                               # refused: why (the JobSpecError)
    Column("claimed_until", Float, nullable=False, default=0.0),   # a beat is submitting it until then
    Column("created_at", Float, nullable=False),
    Column("pruned_at", Float),                          # its output was removed by retention
    PrimaryKeyConstraint("schedule_id", "period_at"),
    Index("ix_barge_schedule_runs_status", "status", "claimed_until"),
    Index("ix_barge_schedule_runs_job", "job_id"),       # the dashboard joins a job to its schedule (0016)
)

cache_files = Table(
    "barge_cache_files", metadata,
    Column("id", String(32), primary_key=True),
    Column("namespace", String(64), nullable=False),
    Column("url", Text, nullable=False),                 # a Parquet file: key + result columns
    Column("created_at", Float, nullable=False),
    Index("ix_barge_cache_files_namespace", "namespace"),
)

cache_entries = Table(
    "barge_cache_entries", metadata,
    Column("namespace", String(64), nullable=False),     # model revision + mode + params
    Column("key", String(64), nullable=False),           # hash of one input value
    Column("file_id", String(32), ForeignKey("barge_cache_files.id", ondelete="CASCADE"), nullable=False),
    Column("row", Integer, nullable=False),              # row of that file
    Column("created_at", Float, nullable=False),
    Column("used_at", Float, nullable=False),            # last written or reused: retention goes by it
    PrimaryKeyConstraint("namespace", "key"),
    Index("ix_barge_cache_entries_used", "namespace", "used_at"),
    Index("ix_barge_cache_entries_file", "file_id"),
)
