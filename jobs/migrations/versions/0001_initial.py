"""Jobs, shards and the webhook outbox.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "barge_jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("status", sa.Integer, nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("model_key", sa.String(200), nullable=False),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("webhook_secret", sa.String(100)),
        sa.Column("rows_total", sa.Integer, nullable=False),
        sa.Column("output_schema", sa.Text, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float),
        sa.Column("finished_at", sa.Float),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_table(
        "barge_shards",
        sa.Column("job_id", sa.String(32), sa.ForeignKey("barge_jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("shard_index", sa.Integer, nullable=False),
        sa.Column("plan", sa.Text, nullable=False),
        sa.Column("num_rows", sa.Integer, nullable=False),
        sa.Column("status", sa.Integer, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("token", sa.String(32)),
        sa.Column("part", sa.Text),
        sa.Column("rows_succeeded", sa.Integer, nullable=False),
        sa.Column("rows_failed", sa.Integer, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("started_at", sa.Float),
        sa.Column("finished_at", sa.Float),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("job_id", "shard_index"),
    )
    op.create_table(
        "barge_webhook_events",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("barge_jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("type", sa.String(40), nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", sa.Float, nullable=False),
        sa.Column("claimed_until", sa.Float, nullable=False),
        sa.Column("last_status_code", sa.Integer),
        sa.Column("last_error", sa.Text),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("delivered_at", sa.Float),
    )
    op.create_index("ix_barge_webhook_events_due", "barge_webhook_events", ["status", "next_attempt_at"])


def downgrade() -> None:
    op.drop_table("barge_webhook_events")
    op.drop_table("barge_shards")
    op.drop_table("barge_jobs")
