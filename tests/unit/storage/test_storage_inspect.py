"""inspect_input: listing inputs and checking their footers."""

from __future__ import annotations

import pyarrow as pa
import pytest

from storage import InputError, inspect_input, plan_shards


def test_glob_lists_matching_files_sorted(tmp_path, make_table, write_parquet, columns):
    # Given three files, one of which does not match the glob
    write_parquet(tmp_path / "b.parquet", make_table(5), row_group_size=2)
    write_parquet(tmp_path / "a.parquet", make_table(3))
    write_parquet(tmp_path / "other.parq", make_table(1))
    # When
    info = inspect_input(str(tmp_path / "*.parquet"), columns=columns)
    # Then
    assert [f.url for f in info.files] == [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    assert info.num_rows == 8
    assert info.files[1].num_row_groups == 3
    assert info.files[1].row_group_rows == (2, 2, 1)
    assert info.schema.names == ["doc_id", "text", "score"]


def test_directory_lists_parquet_files_recursively_skipping_hidden(tmp_path, make_table, write_parquet, columns):
    (tmp_path / "day=2").mkdir()
    write_parquet(tmp_path / "day=2" / "x.parquet", make_table(2))
    write_parquet(tmp_path / "a.parquet", make_table(1))
    write_parquet(tmp_path / "_hidden.parquet", make_table(1))
    write_parquet(tmp_path / ".tmp.parquet", make_table(1))
    (tmp_path / "_SUCCESS").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("not data")

    info = inspect_input(str(tmp_path), columns=columns)

    assert [f.url for f in info.files] == [str(tmp_path / "a.parquet"), str(tmp_path / "day=2" / "x.parquet")]


def test_list_of_urls_keeps_order_and_drops_repeats(tmp_path, make_table, write_parquet, columns):
    b = write_parquet(tmp_path / "b.parquet", make_table(2))
    a = write_parquet(tmp_path / "a.parquet", make_table(1))

    info = inspect_input([b, "file://" + a, b], columns=columns)

    assert [f.url for f in info.files] == [b, a]


def test_no_match_names_the_pattern(tmp_path, columns):
    with pytest.raises(InputError, match=r"nothing-\*\.parquet: no files match"):
        inspect_input(str(tmp_path / "nothing-*.parquet"), columns=columns)


def test_missing_file_and_empty_directory(tmp_path, columns):
    with pytest.raises(InputError, match="missing.parquet: no such file"):
        inspect_input(str(tmp_path / "missing.parquet"), columns=columns)
    with pytest.raises(InputError, match="no \\*.parquet files"):
        inspect_input(str(tmp_path), columns=columns)


def test_not_a_parquet_file_names_the_file(tmp_path, columns):
    (tmp_path / "x.parquet").write_text("just some text, long enough to have a footer-sized tail")
    with pytest.raises(InputError, match=r"x\.parquet: not a Parquet file"):
        inspect_input(str(tmp_path / "x.parquet"), columns=columns)


def test_truncated_parquet_file_is_corrupt(tmp_path, make_table, write_parquet, columns):
    path = tmp_path / "cut.parquet"
    write_parquet(path, make_table(100))
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(InputError, match=r"cut\.parquet: not a Parquet file, or its footer is corrupt"):
        inspect_input(str(path), columns=columns)


def test_missing_column_names_role_column_and_existing_columns(tmp_path, make_table, write_parquet):
    path = write_parquet(tmp_path / "a.parquet", make_table(2))
    with pytest.raises(InputError) as caught:
        inspect_input(path, columns={"input_column": "body", "id_column": "doc_id"})
    message = str(caught.value)
    assert "a.parquet" in message and "'body'" in message and "input_column" in message
    assert "doc_id, text, score" in message


def test_missing_column_in_a_later_file_names_that_file(tmp_path, make_table, write_parquet, columns):
    write_parquet(tmp_path / "a.parquet", make_table(2))
    write_parquet(tmp_path / "b.parquet", make_table(2).drop_columns(["doc_id"]))
    with pytest.raises(InputError, match=r"b\.parquet: column 'doc_id' \(the id_column\)"):
        inspect_input(str(tmp_path), columns=columns)


def test_wrong_text_column_type_names_column_type_and_file(tmp_path, write_parquet, columns):
    table = pa.table({"doc_id": [1, 2], "text": pa.array([1.5, 2.5], pa.float64())})
    path = write_parquet(tmp_path / "num.parquet", table)
    with pytest.raises(InputError, match=r"num\.parquet: column 'text' \(the input_column\) has type double"):
        inspect_input(path, columns=columns)


@pytest.mark.parametrize("text", [
    pa.array(["a", "b"], pa.string_view()),                          # newer Arrow, Polars
    pa.array(["a", "b"]).dictionary_encode(),                         # pandas' category dtype
    pa.array([b"a", b"b"], pa.binary()),                              # text stored as bytes
])
def test_text_as_real_files_hold_it_is_accepted_and_counted_in_tokens(tmp_path, write_parquet, columns, text):
    path = write_parquet(tmp_path / "a.parquet", pa.table({"doc_id": [1, 2], "text": text}))
    info = inspect_input(path, columns=columns)
    assert info.num_rows == 2 and info.work_unit == "tokens"


def test_large_string_text_column_is_accepted(tmp_path, write_parquet, columns):
    table = pa.table({"doc_id": [1], "text": pa.array(["a"], pa.large_string())})
    info = inspect_input(write_parquet(tmp_path / "a.parquet", table), columns=columns)
    assert info.num_rows == 1


def test_other_roles_are_only_checked_for_presence(tmp_path, write_parquet):
    table = pa.table({"doc_id": [1], "audio": pa.array([b"RIFF"], pa.binary())})
    info = inspect_input(write_parquet(tmp_path / "a.parquet", table),
                         columns={"audio_column": "audio", "id_column": "doc_id", "unused": None})
    assert info.num_rows == 1


@pytest.mark.parametrize("other, problem", [
    (pa.table({"doc_id": [1], "text": ["a"], "score": pa.array([1], pa.int32())}), r"column 'score' is int32, not double"),
    (pa.table({"doc_id": [1], "text": ["a"]}), r"missing columns \['score'\]"),
    (pa.table({"doc_id": [1], "text": ["a"], "score": [1.0], "more": [1]}), r"extra columns \['more'\]"),
])
def test_differing_schemas_name_the_file_and_difference(tmp_path, make_table, write_parquet, columns, other, problem):
    write_parquet(tmp_path / "a.parquet", make_table(2))
    write_parquet(tmp_path / "b.parquet", other)
    with pytest.raises(InputError, match=r"b\.parquet: schema differs from .*a\.parquet: " + problem):
        inspect_input(str(tmp_path), columns=columns)


def test_column_order_and_metadata_do_not_count_as_differences(tmp_path, make_table, write_parquet, columns):
    write_parquet(tmp_path / "a.parquet", make_table(2))
    reordered = make_table(2).select(["text", "score", "doc_id"]).replace_schema_metadata({"k": "v"})
    write_parquet(tmp_path / "b.parquet", reordered)
    assert inspect_input(str(tmp_path), columns=columns).num_rows == 4


def test_empty_file_is_valid_and_yields_no_shards(tmp_path, make_table, write_parquet, columns):
    write_parquet(tmp_path / "a.parquet", make_table(0))
    write_parquet(tmp_path / "b.parquet", make_table(3))

    info = inspect_input(str(tmp_path), columns=columns)
    shards = plan_shards(info)

    assert info.files[0].num_rows == 0
    assert [(s.file_index, s.num_rows) for s in shards] == [(1, 3)]


def test_with_many_bad_files_the_first_in_order_is_named(tmp_path, make_table, write_parquet, columns):
    # Footers are fetched concurrently; the error must still be deterministic.
    write_parquet(tmp_path / "a00.parquet", make_table(1))
    for index in range(1, 40):
        (tmp_path / f"a{index:02d}.parquet").write_text("not parquet")
    with pytest.raises(InputError, match=r"a01\.parquet: not a Parquet file"):
        inspect_input(str(tmp_path), columns=columns)
