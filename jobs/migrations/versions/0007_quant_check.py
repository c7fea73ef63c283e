"""The FP8 quality check of a job (JobSpec.quant_check_rows), stored with the job.

JSON in a Text column, as the spec, the shard plans and the engine settings are: the
same on SQLite and PostgreSQL, read back with json.loads in one place (jobs.store).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""
import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("barge_jobs") as batch:
        batch.add_column(sa.Column("quant_check", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("barge_jobs") as batch:
        batch.drop_column("quant_check")
