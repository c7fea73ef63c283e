"""Fixtures shared by the storage unit tests: small Parquet files with chosen row groups."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest


def _make_table(num_rows: int, start: int = 0) -> pa.Table:
    ids = list(range(start, start + num_rows))
    return pa.table({
        "doc_id": pa.array(ids, pa.int64()),
        "text": pa.array([f"row {i}" for i in ids], pa.string()),
        "score": pa.array([i / 2 for i in ids], pa.float64()),
    })


def _write_parquet(path, table: pa.Table, row_group_size: int | None = None) -> str:
    pq.write_table(table, str(path), row_group_size=row_group_size)
    return str(path)


@pytest.fixture
def make_table():
    """make_table(num_rows, start=0) -> table of doc_id (int64), text (string), score (float64)."""
    return _make_table


@pytest.fixture
def write_parquet():
    """write_parquet(path, table, row_group_size=None) -> str(path)."""
    return _write_parquet


@pytest.fixture
def columns() -> dict[str, str]:
    return {"input_column": "text", "id_column": "doc_id"}
