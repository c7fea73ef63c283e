"""Listings that stay fast with history (issue 41): `barge jobs` and the dashboard's jobs
list read a page newest first, keyset over (created_at, id) (jobs.job_list). Without an
index on created_at every page sorted the whole table; with these a page is an index range
whatever its depth, also when filtered by status. The dashboard's list joins each job to
its batch (its owner) and its schedule run: without an index on their job_id, PostgreSQL
hashed every job of the range before sorting (78 ms for the first page of 100,000 jobs, 10%
of them batches), now it follows the index for the page's rows only (0.9 ms).

On PostgreSQL, CREATE INDEX blocks writes to the table while it builds: 0.13 s for the two
on 100,000 jobs (bench/listing_bench.py's store, 2-core AMD EPYC), far inside a lease.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06
"""
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_barge_jobs_created", "barge_jobs", ["created_at", "id"])
    op.create_index("ix_barge_jobs_status_created", "barge_jobs", ["status", "created_at", "id"])
    op.create_index("ix_barge_api_batches_job", "barge_api_batches", ["job_id"])
    op.create_index("ix_barge_schedule_runs_job", "barge_schedule_runs", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_barge_schedule_runs_job", "barge_schedule_runs")
    op.drop_index("ix_barge_api_batches_job", "barge_api_batches")
    op.drop_index("ix_barge_jobs_status_created", "barge_jobs")
    op.drop_index("ix_barge_jobs_created", "barge_jobs")
