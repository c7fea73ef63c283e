"""What a committed generate shard records beyond its tokens (issues 47 and 44,
jobs.generate_usage): prompt tokens computed and served from the prefix cache, the prefill
lower bound, and rows and tokens per LoRA adapter, as JSON. Shards committed before it, and
shards of other modes, keep NULL.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07
"""
import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("barge_shards") as batch:
        batch.add_column(sa.Column("generate_usage", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("barge_shards") as batch:
        batch.drop_column("generate_usage")
