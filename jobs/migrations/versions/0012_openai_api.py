"""The OpenAI-compatible API's tables (api/, jobs.api_tables): API keys (hashed), files
with their owner, and batches, each naming the job that runs it.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "barge_api_keys",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("secret_sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("revoked_at", sa.Float),
    )
    op.create_table(
        "barge_api_files",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("key_id", sa.String(40), sa.ForeignKey("barge_api_keys.id"), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("filename", sa.String(255), nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("deleted_at", sa.Float),
    )
    op.create_index("ix_barge_api_files_owner", "barge_api_files", ["key_id", "created_at"])
    op.create_table(
        "barge_api_batches",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("key_id", sa.String(40), sa.ForeignKey("barge_api_keys.id"), nullable=False),
        sa.Column("job_id", sa.String(32)),
        sa.Column("endpoint", sa.String(40), nullable=False),
        sa.Column("model", sa.String(200)),
        sa.Column("input_file_id", sa.String(40), nullable=False),
        sa.Column("completion_window", sa.String(16), nullable=False),
        sa.Column("metadata", sa.Text, nullable=False),
        sa.Column("errors", sa.Text),
        sa.Column("num_requests", sa.Integer, nullable=False),
        sa.Column("num_completed", sa.Integer),
        sa.Column("num_failed", sa.Integer),
        sa.Column("output_file_id", sa.String(40)),
        sa.Column("error_file_id", sa.String(40)),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("cancelling_at", sa.Float),
        sa.Column("settled_at", sa.Float),
    )
    op.create_index("ix_barge_api_batches_owner", "barge_api_batches", ["key_id", "created_at"])


def downgrade() -> None:
    op.drop_table("barge_api_batches")
    op.drop_table("barge_api_files")
    op.drop_table("barge_api_keys")
