"""What each committed shard used: tokens processed and the engine that ran it.

`num_tokens` is the shard's work in tokens (embed: tokens fed to the model; generate:
prompt plus output tokens), `device` the device type of the worker that committed it
(cpu | cuda | mps), `engine` that engine's settings as JSON. Throughput, ETA and the
job report (`barge report`) are computed from these and the shard times.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""
import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("barge_shards") as batch:
        batch.add_column(sa.Column("num_tokens", sa.BigInteger, nullable=False, server_default="0"))
        batch.add_column(sa.Column("device", sa.String(16)))
        batch.add_column(sa.Column("engine", sa.Text))
    op.create_index("ix_barge_shards_finished", "barge_shards", ["job_id", "finished_at"])


def downgrade() -> None:
    op.drop_index("ix_barge_shards_finished", "barge_shards")
    with op.batch_alter_table("barge_shards") as batch:
        batch.drop_column("engine")
        batch.drop_column("device")
        batch.drop_column("num_tokens")
