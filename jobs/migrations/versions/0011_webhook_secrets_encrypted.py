"""Webhook secrets at rest: every stored secret (a job's current and previous one, a
schedule's) is encrypted with the store's key (jobs.secret_box); the columns become Text,
as a Fernet token is about four times the length of the secret it holds.

Secrets an older revision stored in plain text are encrypted here, once, under the key
the migrating Store opened with (Store.migrate hands it over). SQLite does not enforce a
VARCHAR's length, so its columns are left as they are (changing a type there rebuilds
the table, and dropping the jobs table would cascade to its shards).

Revision ID: 0011
Revises: 0009
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import context, op

revision = "0011"
down_revision = "0009"
branch_labels = None
depends_on = None

SECRET_COLUMNS = {"barge_jobs": ("webhook_secret", "webhook_secret_previous"), "barge_schedules": ("webhook_secret",)}
PREFIX = "fernet:"   # jobs.secret_box.PREFIX, fixed here as this revision wrote it


def upgrade() -> None:
    _set_type(sa.Text())
    box = context.config.attributes["secret_box"]
    _rewrite(lambda stored: stored if stored.startswith(PREFIX) else box.encrypt(stored))


def downgrade() -> None:
    box = context.config.attributes["secret_box"]
    _rewrite(box.decrypt)
    _set_type(sa.String(100))


def _set_type(type_) -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    for table, columns in SECRET_COLUMNS.items():
        for column in columns:
            op.alter_column(table, column, type_=type_)


def _rewrite(convert) -> None:
    conn = op.get_bind()
    for table_name, columns in SECRET_COLUMNS.items():
        for column_name in columns:
            table = sa.table(table_name, sa.column("id", sa.String), sa.column(column_name, sa.Text))
            column = table.c[column_name]
            for row_id, stored in conn.execute(sa.select(table.c.id, column).where(column.is_not(None))).all():
                rewritten = convert(stored)
                if rewritten != stored:
                    conn.execute(sa.update(table).where(table.c.id == row_id).values({column_name: rewritten}))
