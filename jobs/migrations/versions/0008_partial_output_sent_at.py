"""A job that ended unfinished owes its partial manifest until the task that writes it
has run: `partial_output_sent_at` says when that task was last sent, so that a send lost
on the way (a client or worker killed after the job's final state, a broker outage) is
sent again by a housekeeper, as a shard's lost message is (queueing.housekeeping).

Jobs that ended before this revision owe nothing (NULL): they are not chased.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04
"""
import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("barge_jobs") as batch:
        batch.add_column(sa.Column("partial_output_sent_at", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("barge_jobs") as batch:
        batch.drop_column("partial_output_sent_at")
