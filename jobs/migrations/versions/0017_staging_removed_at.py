"""Leftovers (issue 41): a job that ends unfinished keeps its staged input files
(storage.stage) for a retry; past BARGE_STAGING_RETENTION_S the housekeeper removes them
and says so here, so that it looks at each job once.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06
"""
import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("barge_jobs") as batch:
        batch.add_column(sa.Column("staging_removed_at", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("barge_jobs") as batch:
        batch.drop_column("staging_removed_at")
