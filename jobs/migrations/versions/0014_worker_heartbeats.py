"""Workers' heartbeats (jobs.worker_beats): each `barge worker` writes its models, its
engines' settings and last step figures every few seconds, for the dashboard's workers
page. Nothing else reads it: a row is a report, not a lease.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "barge_workers",
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("models", sa.Text, nullable=False),
        sa.Column("engines", sa.Text, nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("heartbeat_at", sa.Float, nullable=False),
        sa.Column("stopped_at", sa.Float),
    )


def downgrade() -> None:
    op.drop_table("barge_workers")
