"""Shard leases and the fair-share window.

A running shard records which worker holds it and until when (`lease_expires_at`,
renewed while it works); `queued_at` records when the shard was last sent to the
broker (NULL: not yet — it waits in its job's window).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("barge_shards") as batch:
        batch.add_column(sa.Column("worker_id", sa.String(200)))
        batch.add_column(sa.Column("lease_expires_at", sa.Float))
        batch.add_column(sa.Column("queued_at", sa.Float))
    op.create_index("ix_barge_shards_lease", "barge_shards", ["status", "lease_expires_at"])


def downgrade() -> None:
    op.drop_index("ix_barge_shards_lease", "barge_shards")
    with op.batch_alter_table("barge_shards") as batch:
        batch.drop_column("queued_at")
        batch.drop_column("lease_expires_at")
        batch.drop_column("worker_id")
