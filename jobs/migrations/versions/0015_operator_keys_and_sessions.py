"""`barge serve` on a network (issue 40): operator keys, and dashboard sessions kept on the
server. An operator key sees every key's jobs on the dashboard (nothing is given by
address any more); a session is a random id whose SHA-256 is stored here, so logging out
revokes it and a copied cookie no longer opens the dashboard.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06
"""
import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("barge_api_keys") as batch:
        batch.add_column(sa.Column("is_operator", sa.Boolean, nullable=False, server_default=sa.false()))
    op.create_table(
        "barge_dashboard_sessions",
        sa.Column("id_sha256", sa.String(64), primary_key=True),
        sa.Column("key_id", sa.String(40), sa.ForeignKey("barge_api_keys.id")),
        sa.Column("is_operator", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("revoked_at", sa.Float),
    )
    op.create_index("ix_barge_dashboard_sessions_expiry", "barge_dashboard_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_barge_dashboard_sessions_expiry", "barge_dashboard_sessions")
    op.drop_table("barge_dashboard_sessions")
    with op.batch_alter_table("barge_api_keys") as batch:
        batch.drop_column("is_operator")
