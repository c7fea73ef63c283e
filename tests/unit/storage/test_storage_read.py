"""read_shard: exactly the planned rows, only the projected columns, bounded batches."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from storage import InputError, ShardPlan, inspect_input, plan_shards, read_shard
from storage.plan import ShardPiece


@pytest.mark.parametrize("num_rows, row_group_size, max_rows, batch_size", [
    (100, 10, 25, 7),     # several row groups per shard
    (100, 100, 30, 8),    # one big row group split by row range
    (1000, 333, 250, 64),  # both, with uneven edges
    (5, 2, 2048, 1024),   # the defaults: one shard per file
])
def test_all_shards_together_are_the_whole_input(tmp_path, make_table, write_parquet, columns,
                                                 num_rows, row_group_size, max_rows, batch_size):
    # Given two files cut into shards
    write_parquet(tmp_path / "a.parquet", make_table(num_rows), row_group_size=row_group_size)
    write_parquet(tmp_path / "b.parquet", make_table(7, start=num_rows), row_group_size=3)
    shards = plan_shards(inspect_input(str(tmp_path), columns=columns), max_rows_per_shard=max_rows)
    # When every shard is read
    batches = [batch for shard in shards for batch in read_shard(shard, ["doc_id", "text"], batch_size=batch_size)]
    # Then the rows come back once each, in order, in bounded batches
    whole = pa.Table.from_batches(batches)
    assert whole.column("doc_id").to_pylist() == list(range(num_rows + 7))
    assert whole.column("text").to_pylist() == [f"row {i}" for i in range(num_rows + 7)]
    assert all(0 < batch.num_rows <= batch_size for batch in batches)


def test_each_shard_reads_its_planned_rows(tmp_path, make_table, write_parquet, columns):
    path = write_parquet(tmp_path / "a.parquet", make_table(50), row_group_size=20)
    for shard in plan_shards(inspect_input(path, columns=columns), max_rows_per_shard=15):
        ids = pa.Table.from_batches(list(read_shard(shard, ["doc_id"], batch_size=4))).column("doc_id").to_pylist()
        assert ids == [piece.row_start + i for piece in shard.pieces for i in range(piece.num_rows)]


def test_only_projected_columns_in_the_order_asked(tmp_path, make_table, write_parquet, columns):
    path = write_parquet(tmp_path / "a.parquet", make_table(10))
    shard = plan_shards(inspect_input(path, columns=columns))[0]

    batches = list(read_shard(shard, ["text", "doc_id"]))

    assert all(batch.schema.names == ["text", "doc_id"] for batch in batches)


def test_missing_column_names_the_file(tmp_path, make_table, write_parquet, columns):
    path = write_parquet(tmp_path / "a.parquet", make_table(10))
    shard = plan_shards(inspect_input(path, columns=columns))[0]
    with pytest.raises(InputError, match=r"a\.parquet: columns \['nope'\] are not in the file"):
        list(read_shard(shard, ["nope"]))


def test_file_changed_since_planning_is_an_error(tmp_path, make_table, write_parquet, columns):
    path = write_parquet(tmp_path / "a.parquet", make_table(30), row_group_size=10)
    shards = plan_shards(inspect_input(path, columns=columns), max_rows_per_shard=10)
    write_parquet(path, make_table(15), row_group_size=10)
    with pytest.raises(InputError, match="changed since planning"):
        list(read_shard(shards[2], ["doc_id"]))
    stale = ShardPlan(shard_index=0, pieces=(ShardPiece(file_index=0, url=path, row_groups=(1,), row_start=10,
                                                        num_rows=10),))
    with pytest.raises(InputError, match="changed since planning"):
        list(read_shard(stale, ["doc_id"]))


def test_reading_stops_after_the_shard(tmp_path, make_table, write_parquet, columns):
    # A shard at the start of a big row group yields only its own rows even though pyarrow
    # decodes the whole row group.
    path = write_parquet(tmp_path / "a.parquet", make_table(100))
    assert pq.ParquetFile(path).metadata.num_row_groups == 1
    first = plan_shards(inspect_input(path, columns=columns), max_rows_per_shard=40)[0]
    assert sum(batch.num_rows for batch in read_shard(first, ["doc_id"], batch_size=16)) == first.num_rows
