"""Alembic environment: migrations run on the connection the store hands over
(`config.attributes["connection"]`), inside the store's own transaction."""

from alembic import context

from jobs.tables import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata)
with context.begin_transaction():
    context.run_migrations()
