"""Schedules for recurring runs, and the results cache behind incremental jobs.

`barge_schedules` holds a cron expression, its time zone, a job template and the
cursor (`next_run_at`): the first fire time not yet handled. `barge_schedule_runs` has
one row per schedule and period; its primary key is what makes two beat processes
create one job per period, whatever their timing.

The results cache is an index: `barge_cache_entries` maps (namespace, key) to a row of
a Parquet file listed in `barge_cache_files`. A namespace is a hash of the model and
its revision, the mode and its parameters; a key is a hash of one input value.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04
"""
import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "barge_schedules",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("cron", sa.String(200), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("template", sa.Text, nullable=False),
        sa.Column("is_enabled", sa.Boolean, nullable=False),
        sa.Column("catchup", sa.String(8), nullable=False),
        sa.Column("retention_s", sa.Float),
        sa.Column("webhook_secret", sa.String(100)),
        sa.Column("next_run_at", sa.Float, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_table(
        "barge_schedule_runs",
        sa.Column("schedule_id", sa.String(32), sa.ForeignKey("barge_schedules.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("period_at", sa.Float, nullable=False),
        sa.Column("kind", sa.String(12), nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("status", sa.String(12), nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("claimed_until", sa.Float, nullable=False, server_default="0"),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("pruned_at", sa.Float),
        sa.PrimaryKeyConstraint("schedule_id", "period_at"),
    )
    op.create_index("ix_barge_schedule_runs_status", "barge_schedule_runs", ["status", "claimed_until"])
    op.create_table(
        "barge_cache_files",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("namespace", sa.String(64), nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_barge_cache_files_namespace", "barge_cache_files", ["namespace"])
    op.create_table(
        "barge_cache_entries",
        sa.Column("namespace", sa.String(64), nullable=False),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("file_id", sa.String(32), sa.ForeignKey("barge_cache_files.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("row", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("used_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("namespace", "key"),
    )
    op.create_index("ix_barge_cache_entries_used", "barge_cache_entries", ["namespace", "used_at"])
    op.create_index("ix_barge_cache_entries_file", "barge_cache_entries", ["file_id"])
    with op.batch_alter_table("barge_jobs") as batch:
        batch.add_column(sa.Column("cache_namespace", sa.String(64)))
    with op.batch_alter_table("barge_shards") as batch:
        batch.add_column(sa.Column("rows_reused", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("barge_shards") as batch:
        batch.drop_column("rows_reused")
    with op.batch_alter_table("barge_jobs") as batch:
        batch.drop_column("cache_namespace")
    op.drop_table("barge_cache_entries")
    op.drop_table("barge_cache_files")
    op.drop_table("barge_schedule_runs")
    op.drop_table("barge_schedules")
