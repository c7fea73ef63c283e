"""Models registered on the workers alone (issue 46, jobs.model_cards): each worker writes
what a submit on another host reads of a registered name it serves — its routing key,
revision and small config files.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06
"""
import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "barge_model_cards",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("file_name", sa.String(500)),
        sa.Column("files", sa.Text, nullable=False),
        sa.Column("revision", sa.String(64), nullable=False),
        sa.Column("announced_by", sa.String(200), nullable=False),
        sa.Column("announced_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("barge_model_cards")
