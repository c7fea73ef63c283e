"""Every non-final job has an owner that moves it on: `task_sent_at` says when the task
that does (plan for a QUEUED job, finalize for a RUNNING job whose shards are all finished
and for a FINALIZING one) was last sent or started, so that a housekeeper sends it again
once it is older than BARGE_REQUEUE_AFTER_S (queueing.housekeeping): a send lost on the
way, or a process killed mid-plan or mid-finalize, leaves no job stranded.

Jobs from before this revision read as sent when they were last updated.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("barge_jobs") as batch:
        batch.add_column(sa.Column("task_sent_at", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("barge_jobs") as batch:
        batch.drop_column("task_sent_at")
