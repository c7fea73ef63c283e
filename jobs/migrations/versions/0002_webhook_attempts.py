"""Webhook attempts, endpoints and job expiry.

Every delivery attempt gets its own row (started before the request goes out, so an
attempt whose dispatcher died is visible too); an endpoint that answered 410 Gone is
disabled by URL; a replay restarts an event's retry budget from `retry_from`; a job may
carry a deadline (`expires_at`).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "barge_webhook_attempts",
        sa.Column("event_id", sa.String(40), sa.ForeignKey("barge_webhook_events.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("finished_at", sa.Float),
        sa.Column("status_code", sa.Integer),
        sa.Column("latency_s", sa.Float),
        sa.Column("error", sa.Text),
        sa.PrimaryKeyConstraint("event_id", "attempt"),
    )
    op.create_table(
        "barge_webhook_endpoints",
        sa.Column("url", sa.Text, primary_key=True),
        sa.Column("disabled_at", sa.Float),
        sa.Column("disabled_reason", sa.Text),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    with op.batch_alter_table("barge_webhook_events") as batch:
        batch.add_column(sa.Column("retry_from", sa.Integer, nullable=False, server_default="0"))
    with op.batch_alter_table("barge_jobs") as batch:
        batch.add_column(sa.Column("expires_at", sa.Float))
    op.create_index("ix_barge_jobs_expires_at", "barge_jobs", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_barge_jobs_expires_at", "barge_jobs")
    with op.batch_alter_table("barge_jobs") as batch:
        batch.drop_column("expires_at")
    with op.batch_alter_table("barge_webhook_events") as batch:
        batch.drop_column("retry_from")
    op.drop_table("barge_webhook_endpoints")
    op.drop_table("barge_webhook_attempts")
