"""Hive-partitioned inputs and carried-through columns."""

from __future__ import annotations

import pyarrow as pa
import pytest

from storage import InputError, inspect_input, plan_shards, read_shard
from storage.partition import hive_partition, partition_root


@pytest.mark.parametrize("root, path, expected", [
    ("/d", "/d/year=2026/month=12/part.parquet", {"year": "2026", "month": "12"}),
    ("/d/", "/d/2026/lang=en/x.parquet", {"lang": "en"}),
    ("/d", "/d/x.parquet", {}),
    ("/d", "/d/city=S%C3%A3o%20Paulo/x.parquet", {"city": "São Paulo"}),
    ("/d", "/d/lang=__HIVE_DEFAULT_PARTITION__/x.parquet", {"lang": None}),
    ("bucket/data", "bucket/data/k=a=b/x.parquet", {"k": "a=b"}),
    ("/elsewhere", "/d/k=v/x.parquet", {}),
])
def test_hive_partition(root, path, expected):
    assert hive_partition(root, path) == expected


@pytest.fixture
def dataset(tmp_path, make_table, write_parquet):
    """year=2025/month=12, year=2026/month=01 (two files), year=2026/month=02: 10 rows each."""
    for index, (year, month) in enumerate([("2025", "12"), ("2026", "01"), ("2026", "01"), ("2026", "02")]):
        directory = tmp_path / f"year={year}" / f"month={month}"
        directory.mkdir(parents=True, exist_ok=True)
        write_parquet(directory / f"part-{index}.parquet", make_table(10, start=10 * index), row_group_size=4)
    return tmp_path


def test_directory_and_glob_give_each_file_its_partition(dataset, columns):
    by_dir = inspect_input(str(dataset), columns=columns, partition_columns=True)
    by_glob = inspect_input(str(dataset / "year=2026" / "*" / "*.parquet"), columns=columns)

    assert [f.partition for f in by_dir.files] == [
        {"year": "2025", "month": "12"}, {"year": "2026", "month": "01"},
        {"year": "2026", "month": "01"}, {"year": "2026", "month": "02"}]
    assert by_dir.partition_keys == ("year", "month")
    # a glob keeps the key=value directories of its fixed part, as would naming year=2026/ itself
    assert [f.partition for f in by_glob.files] == [{"year": "2026", "month": "01"}] * 2 + [
        {"year": "2026", "month": "02"}]
    assert by_glob.partition_keys == ()  # only checked and set when asked for


def test_a_partition_directory_or_file_named_directly_keeps_its_keys(dataset, columns):
    one_year = inspect_input(str(dataset / "year=2026"), columns=columns)
    one_file = inspect_input(str(dataset / "year=2025" / "month=12" / "part-0.parquet"), columns=columns)
    assert [f.partition["year"] for f in one_year.files] == ["2026"] * 3
    assert one_file.files[0].partition == {"year": "2025", "month": "12"}


@pytest.mark.parametrize("directory, root", [
    ("/d/year=1/m=2", "/d"), ("/d/year=1/x", "/d/year=1/x"), ("bucket", "bucket"), ("/d/", "/d")])
def test_partition_root(directory, root):
    assert partition_root(directory) == root


def test_read_shard_adds_partition_values_as_constant_string_columns(dataset, columns):
    info = inspect_input(str(dataset), columns=columns, partition_columns=True)
    shards = plan_shards(info, max_rows_per_shard=6)

    batches = [b for shard in shards for b in read_shard(shard, ["doc_id"], batch_size=3, partition_columns=True)]
    table = pa.Table.from_batches(batches)

    assert table.schema == pa.schema([("doc_id", pa.int64()), ("year", pa.string()), ("month", pa.string())])
    assert table.column("doc_id").to_pylist() == list(range(40))
    assert table.column("year").to_pylist() == ["2025"] * 10 + ["2026"] * 30
    assert table.column("month").to_pylist() == ["12"] * 10 + ["01"] * 20 + ["02"] * 10
    assert {tuple(b.schema.names) for b in read_shard(shards[0], ["doc_id"])} == {("doc_id",)}  # off by default


def test_files_with_different_partition_keys_are_refused_when_partition_columns_are_asked_for(
        dataset, make_table, write_parquet, columns):
    (dataset / "year=2027").mkdir()
    write_parquet(dataset / "year=2027" / "stray.parquet", make_table(1))
    assert len(inspect_input(str(dataset), columns=columns).files) == 5  # fine when not carried
    with pytest.raises(InputError, match=r"stray\.parquet: partition keys \['year'\] differ from \['year', 'month'\]"):
        inspect_input(str(dataset), columns=columns, partition_columns=True)


def test_a_partition_key_that_is_also_a_column_is_refused(tmp_path, make_table, write_parquet, columns):
    (tmp_path / "score=1").mkdir()
    write_parquet(tmp_path / "score=1" / "a.parquet", make_table(2))
    with pytest.raises(InputError, match=r"partition keys \['score'\] are also columns in the file"):
        inspect_input(str(tmp_path), columns=columns, partition_columns=True)


def test_carry_columns_are_checked_and_read_with_the_input(tmp_path, make_table, write_parquet, columns):
    path = write_parquet(tmp_path / "a.parquet", make_table(10), row_group_size=3)
    info = inspect_input(path, columns=columns, carry_columns=["score"])

    rows = pa.Table.from_batches([b for s in plan_shards(info, max_rows_per_shard=4)
                                  for b in read_shard(s, ["text", "doc_id", "score"])])

    assert rows.schema.names == ["text", "doc_id", "score"]
    assert rows.column("score").to_pylist() == [i / 2 for i in range(10)]


def test_a_missing_carry_column_names_the_file_and_the_column(tmp_path, make_table, write_parquet, columns):
    path = write_parquet(tmp_path / "a.parquet", make_table(2))
    with pytest.raises(InputError) as caught:
        inspect_input(path, columns=columns, carry_columns=["score", "lang"])
    assert str(caught.value) == (f"{path}: column 'lang' (in carry_columns) is not in the file; "
                                 "its columns are: doc_id, text, score")
