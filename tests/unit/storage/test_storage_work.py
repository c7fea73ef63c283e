"""Work-based shard sizing: estimates from footers, and plans bounded by rows and work."""

from __future__ import annotations

import pyarrow as pa
import pytest

from storage import InputFile, InputInfo, inspect_input, plan_shards
from storage.work import AUDIO_SECONDS, BYTES_PER_TOKEN, TOKENS, estimate_work, work_unit


def info_of(*files: tuple[tuple[int, ...], tuple[int, ...]]) -> InputInfo:
    """files: (row_group_rows, row_group_work) per file."""
    input_files = tuple(InputFile(url=f"memory://in/{i}.parquet", num_rows=sum(rows), num_row_groups=len(rows),
                                  row_group_rows=rows, row_group_work=work)
                        for i, (rows, work) in enumerate(files))
    return InputInfo(files=input_files, schema=pa.schema([("text", pa.string())]),
                     num_rows=sum(f.num_rows for f in input_files))


def test_estimates_by_unit():
    assert work_unit(pa.string()) == work_unit(pa.large_string()) == TOKENS
    assert work_unit(pa.binary()) == AUDIO_SECONDS
    assert estimate_work(TOKENS, 4000) == 4000 // BYTES_PER_TOKEN
    assert estimate_work(TOKENS, 1) == 1 and estimate_work(TOKENS, 0) == 0
    assert estimate_work(AUDIO_SECONDS, 160_000) == 10
    with pytest.raises(ValueError, match="work unit 'pages'"):
        estimate_work("pages", 1)


# Each case: (rows, work) per row group of one file, max rows, max work -> each shard's pieces,
# (row_groups, row_start, num_rows, work).
CASES = {
    "work closes a shard before rows do": (
        ((10, 10, 10, 10), (50, 50, 50, 50)), 100, 100,
        [[((0, 1), 0, 20, 100)], [((2, 3), 20, 20, 100)]],
    ),
    "rows close a shard before work does": (
        ((10, 10, 10), (1, 1, 1)), 20, 100,
        [[((0, 1), 0, 20, 2)], [((2,), 20, 10, 1)]],
    ),
    "a heavy row group is split by work into near-equal row ranges, packed with light ones": (
        ((2, 10, 2), (5, 300, 5)), 100, 100,
        [[((0,), 0, 2, 5), ((1,), 2, 3, 90)], [((1,), 5, 3, 90)], [((1,), 8, 2, 60)],
         [((1,), 10, 2, 60), ((2,), 12, 2, 5)]],
    ),
    "a single row over the work limit is a shard of its own": (
        ((2,), (1000,)), 100, 10,
        [[((0,), 0, 1, 500)], [((0,), 1, 1, 500)]],
    ),
    "no work limit: rows only": (
        ((10, 10), (10**9, 10**9)), 20, None,
        [[((0, 1), 0, 20, 2 * 10**9)]],
    ),
}


@pytest.mark.parametrize("groups, max_rows, max_work, expected", CASES.values(), ids=CASES.keys())
def test_plan_by_rows_and_work(groups, max_rows, max_work, expected):
    shards = plan_shards(info_of(groups), max_rows_per_shard=max_rows, max_work_per_shard=max_work)
    assert [[(p.row_groups, p.row_start, p.num_rows, p.work) for p in s.pieces] for s in shards] == expected


def test_every_row_and_all_work_land_in_exactly_one_shard():
    rows = (1000, 7, 3000, 1, 0, 2048)
    work = (90_000, 7, 1_000, 5_000, 0, 2048)
    info = info_of((rows, work), (rows[::-1], work[::-1]))
    shards = plan_shards(info, max_rows_per_shard=512, max_work_per_shard=4096)
    assert all(s.num_rows <= 512 and (s.work <= 4096 or s.num_rows == 1) for s in shards)
    for file_index, input_file in enumerate(info.files):
        own = [p for s in shards for p in s.pieces if p.file_index == file_index]
        assert sum(p.num_rows for p in own) == input_file.num_rows
        assert sum(p.work for p in own) == sum(input_file.row_group_work)
        for before, after in zip(own, own[1:]):
            assert after.row_start == before.row_start + before.num_rows


def test_footers_without_estimates_plan_by_rows_only():
    info = info_of(((10, 10), ()))
    shards = plan_shards(info, max_rows_per_shard=20, max_work_per_shard=1)
    assert [(s.num_rows, s.work) for s in shards] == [(20, 0)]


def test_bad_work_limit():
    with pytest.raises(ValueError, match="max_work_per_shard must be at least 1 or None, got 0"):
        plan_shards(info_of(((1,), (1,))), max_work_per_shard=0)
    with pytest.raises(ValueError, match="2 work estimates for 1 row groups"):
        InputFile(url="x", num_rows=1, num_row_groups=1, row_group_rows=(1,), row_group_work=(1, 1))


def test_inspect_estimates_tokens_per_row_group_from_the_input_column(tmp_path, write_parquet):
    # Given short rows then long rows, in row groups of 100, and a big column that is not the input
    short, long = ["tiny"] * 200, ["a long document " * 64] * 200
    table = pa.table({"doc_id": range(400), "text": short + long, "blob": [b"x" * 4000] * 400})
    path = write_parquet(tmp_path / "a.parquet", table, row_group_size=100)
    info = inspect_input(path, columns={"input_column": "text", "id_column": "doc_id"})
    work = info.files[0].row_group_work
    # Then the work follows the text column only (dictionary-encoded repeats stay cheap, see storage.work)
    assert info.work_unit == TOKENS and len(work) == 4
    assert work[0] == work[1] and work[2] == work[3] and work[2] > work[0]
    assert info.total_work == sum(work)


def test_inspect_estimates_unique_text_at_about_four_bytes_a_token(tmp_path, write_parquet):
    texts = [f"document number {i} " * 20 for i in range(1000)]  # ~400 bytes each, all distinct
    path = write_parquet(tmp_path / "a.parquet", pa.table({"text": texts}), row_group_size=250)
    info = inspect_input(path, columns={"input_column": "text"})
    num_bytes = sum(len(t) for t in texts)
    assert num_bytes / 4 <= info.total_work <= num_bytes / 4 * 1.2


def test_audio_column_is_measured_in_seconds(tmp_path, write_parquet):
    table = pa.table({"doc_id": [1, 2], "audio": pa.array([bytes([i]) * 160_000 for i in range(2)], pa.binary())})
    info = inspect_input(write_parquet(tmp_path / "a.parquet", table), columns={"audio_column": "audio"})
    assert info.work_unit == AUDIO_SECONDS
    assert info.files[0].row_group_work == (21,)  # 2 x 160 kB at 16 kB/s, plus lengths and headers


def test_planning_a_real_input_twice_gives_identical_shards(tmp_path, make_table, write_parquet, columns):
    write_parquet(tmp_path / "a.parquet", make_table(5000), row_group_size=700)
    write_parquet(tmp_path / "b.parquet", make_table(3000, start=5000), row_group_size=1300)
    first = plan_shards(inspect_input(str(tmp_path), columns=columns), max_rows_per_shard=1000, max_work_per_shard=900)
    again = plan_shards(inspect_input(str(tmp_path), columns=columns), max_rows_per_shard=1000, max_work_per_shard=900)
    assert first == again
    assert len(first) > 10 and {s.work <= 900 or s.num_rows == 1 for s in first} == {True}
