"""Webhook secret rotation: a job's previous secret stays valid until a deadline, and
deliveries until then carry a signature under each secret.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""
import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("barge_jobs") as batch:
        batch.add_column(sa.Column("webhook_secret_previous", sa.String(100)))
        batch.add_column(sa.Column("webhook_secret_previous_until", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("barge_jobs") as batch:
        batch.drop_column("webhook_secret_previous_until")
        batch.drop_column("webhook_secret_previous")
