"""A job nobody serves (issue 46): the housekeeper that first sees it writes its
job.stalled webhook event and says so here, in the same transaction, so that a fleet of
housekeepers sends it once.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06
"""
import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("barge_jobs") as batch:
        batch.add_column(sa.Column("stalled_notified_at", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("barge_jobs") as batch:
        batch.drop_column("stalled_notified_at")
