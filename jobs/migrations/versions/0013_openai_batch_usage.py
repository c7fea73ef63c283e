"""A settled OpenAI batch keeps its token usage (the Batch object's `usage`): the input
and output tokens of the requests in its output file, as JSON.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("barge_api_batches") as batch:
        batch.add_column(sa.Column("usage", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("barge_api_batches") as batch:
        batch.drop_column("usage")
