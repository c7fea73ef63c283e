"""Layouts as real corpora have them: shards packed from many files, row groups bigger
than a shard staged once, lying footers named, text in every type writers use, ids counted."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from storage import InputError, inspect_input, plan_shards, read_shard
from storage.ids import summarize_ids
from storage.stage import remove_staging, stage_split_pieces, staging_url
from storage.text import text_values


def read_ids(shards, columns=("doc_id",)) -> list[int]:
    return [i for shard in shards for b in read_shard(shard, list(columns), batch_size=64)
            for i in b.column(0).to_pylist()]


def test_many_small_files_pack_into_few_shards_that_read_every_row_once(tmp_path, make_table, write_parquet, columns):
    for f in range(40):
        write_parquet(tmp_path / f"f{f:03d}.parquet", make_table(5, start=5 * f))
    write_parquet(tmp_path / "f999.parquet", make_table(0))   # an empty file: no rows, no error

    shards = plan_shards(inspect_input(str(tmp_path), columns=columns), max_rows_per_shard=64)

    assert len(shards) == 4   # ceil(200 / 64)
    assert read_ids(shards) == list(range(200))


def test_an_empty_file_whose_text_column_is_typed_null_gives_no_rows_and_no_error(tmp_path, make_table,
                                                                                  write_parquet, columns):
    # pandas writes an empty DataFrame's text column as type null
    write_parquet(tmp_path / "a.parquet", pa.table({"doc_id": pa.array([], pa.int64()), "text": pa.array([])}))
    write_parquet(tmp_path / "b.parquet", make_table(3))
    info = inspect_input(str(tmp_path), columns=columns)
    assert info.schema.field("text").type == pa.string() and info.num_rows == 3
    assert read_ids(plan_shards(info)) == [0, 1, 2]


def test_a_row_group_bigger_than_a_shard_is_staged_once_and_read_back_exactly(tmp_path, make_table, write_parquet,
                                                                             columns):
    (tmp_path / "in").mkdir()
    write_parquet(tmp_path / "in" / "a.parquet", make_table(1000))   # one row group of 1000 rows
    write_parquet(tmp_path / "in" / "b.parquet", make_table(30, start=1000), row_group_size=10)
    info = inspect_input(str(tmp_path / "in"), columns=columns)
    shards = plan_shards(info, max_rows_per_shard=128)
    staging = staging_url(str(tmp_path / "out"), "job1")

    staged, report = stage_split_pieces(shards, ["text", "doc_id"], staging)

    assert (report.num_row_groups, report.num_files) == (1, 8)   # 1000 rows in 8 near-equal pieces
    split = [p for s in staged for p in s.pieces if p.is_split]
    assert len(split) == 8 and all(p.staged_url and pq.ParquetFile(p.staged_url).metadata.num_rows == p.num_rows
                                   for p in split)
    assert read_ids(staged) == list(range(1030))
    # A staged copy that has gone (its job committed, then retried) is read from the input.
    remove_staging(str(tmp_path / "out"), "job1")
    assert not (tmp_path / "out" / "_barge_staging").exists()   # no job has staged files there any more
    assert read_ids(staged) == list(range(1030))


def test_a_footer_that_lies_about_its_data_names_the_file(tmp_path, make_table, write_parquet, columns):
    write_parquet(tmp_path / "ok.parquet", make_table(500))
    data = (tmp_path / "ok.parquet").read_bytes()
    (tmp_path / "ok.parquet").unlink()
    (tmp_path / "short.parquet").write_bytes(data[:4] + data[1004:])   # 1000 bytes of data cut out, footer kept
    with pytest.raises(InputError, match=r"short\.parquet: its footer lies: row group 0 column '\w+' ends at byte"):
        inspect_input(str(tmp_path), columns=columns)


def test_not_parquet_is_named(tmp_path, columns):
    (tmp_path / "x.parquet").write_bytes(b"hello, this is not parquet")
    with pytest.raises(InputError, match=r"x\.parquet: not a Parquet file"):
        inspect_input(str(tmp_path), columns=columns)


@pytest.mark.parametrize("column, expected, errors", [
    (pa.array(["a", None, "c"]).dictionary_encode(), ["a", None, "c"], {}),
    (pa.array(["a", None, "c"], pa.string_view()), ["a", None, "c"], {}),
    (pa.array([b"caf\xc3\xa9", None, b"\xff\xfe"], pa.binary()), ["café", None, None], {2}),
    (pa.array([b"ok"], pa.large_binary()), ["ok"], set()),
])
def test_text_values_of_every_text_type(tmp_path, column, expected, errors):
    # Through a Parquet file and back, as a shard reads them.
    pq.write_table(pa.table({"text": column}), tmp_path / "t.parquet")
    values, row_errors = text_values(pq.read_table(tmp_path / "t.parquet").column("text"))
    assert values == expected
    assert set(row_errors) == set(errors)
    assert all("not UTF-8" in error for error in row_errors.values())


def test_duplicate_and_null_ids_are_counted_in_input_order():
    ids = pa.chunked_array([[7, 1, 2], [1, None, 7, 7, 3]])
    summary = summarize_ids(ids)
    assert (summary.num_rows, summary.num_null, summary.num_duplicated_ids, summary.num_duplicate_rows) == (8, 1, 2, 3)
    assert summary.first_duplicates == ((7, (0, 5, 6)), (1, (1, 3)))
    assert "2 ids appear more than once (3 rows repeat an earlier row's id); the first: 7 at input rows 0, 5, 6" \
        in summary.describe_duplicates()
    assert summarize_ids(pa.array(["a", "b"]).dictionary_encode()).num_duplicate_rows == 0


def test_bytes_to_read_count_the_columns_the_job_reads_not_the_others(tmp_path, write_parquet, columns):
    wide = pa.table({"doc_id": [1, 2], "text": ["x", "y"], "blob": [os.urandom(50_000), os.urandom(50_000)]})
    info = inspect_input(write_parquet(tmp_path / "a.parquet", wide), columns=columns)
    file = info.files[0]
    assert file.num_read_bytes < 10_000 < file.num_bytes   # the blob column is in the file, not in the reads
    with_blob = inspect_input(str(tmp_path / "a.parquet"), columns=columns, carry_columns=["blob"]).files[0]
    assert with_blob.num_read_bytes > 10_000


def test_inspect_summarizes_ids_over_all_files_only_when_asked(tmp_path, write_parquet, columns):
    write_parquet(tmp_path / "a.parquet", pa.table({"doc_id": [1, 2, 3], "text": ["x", "y", "z"]}))
    write_parquet(tmp_path / "b.parquet", pa.table({"doc_id": [3, None], "text": ["w", "v"]}))
    assert inspect_input(str(tmp_path), columns=columns).ids is None
    summary = inspect_input(str(tmp_path), columns=columns, summarize_ids=True).ids
    assert (summary.num_null, summary.num_duplicate_rows, summary.first_duplicates) == (1, 1, ((3, (2, 3)),))
