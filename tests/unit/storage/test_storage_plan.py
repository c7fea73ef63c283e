"""plan_shards: a pure function of footer row counts, table-tested on fabricated footers."""

from __future__ import annotations

import pyarrow as pa
import pytest

from storage import InputFile, InputInfo, ShardPlan, plan_shards


def info_of(*files_row_groups: tuple[int, ...]) -> InputInfo:
    files = tuple(
        InputFile(url=f"memory://in/{i}.parquet", num_rows=sum(rows), num_row_groups=len(rows), row_group_rows=rows)
        for i, rows in enumerate(files_row_groups)
    )
    return InputInfo(files=files, schema=pa.schema([("text", pa.string())]), num_rows=sum(f.num_rows for f in files))


# Each case: row groups per file, max_rows_per_shard -> (file_index, row_groups, row_start, num_rows) per shard.
CASES = {
    "row groups grouped up to the limit": (
        [(3, 3, 3, 3)], 6,
        [(0, (0, 1), 0, 6), (0, (2, 3), 6, 6)],
    ),
    "a group that does not fit starts a new shard": (
        [(4, 3, 2)], 6,
        [(0, (0,), 0, 4), (0, (1, 2), 4, 5)],
    ),
    "exactly the limit": (
        [(6,)], 6,
        [(0, (0,), 0, 6)],
    ),
    "big row group split by row range into near-equal pieces": (
        [(2, 13, 1)], 6,
        [(0, (0,), 0, 2), (0, (1,), 2, 5), (0, (1,), 7, 4), (0, (1,), 11, 4), (0, (2,), 15, 1)],
    ),
    "shards never span files": (
        [(2,), (2, 2)], 10,
        [(0, (0,), 0, 2), (1, (0, 1), 0, 4)],
    ),
    "empty files and empty row groups yield nothing": (
        [(), (0,), (0, 3, 0, 2)], 10,
        [(2, (1, 2, 3), 0, 5)],
    ),
    "limit of one row": (
        [(2, 1)], 1,
        [(0, (0,), 0, 1), (0, (0,), 1, 1), (0, (1,), 2, 1)],
    ),
}


@pytest.mark.parametrize("files, max_rows, expected", CASES.values(), ids=CASES.keys())
def test_plan_table(files, max_rows, expected):
    shards = plan_shards(info_of(*files), max_rows_per_shard=max_rows)
    assert [(s.file_index, s.row_groups, s.row_start, s.num_rows) for s in shards] == expected
    assert [s.shard_index for s in shards] == list(range(len(expected)))


@pytest.mark.parametrize("row_groups, max_rows", [
    ((1000, 1000, 1000), 2048),
    ((5000, 7, 3000, 1, 1, 2048, 2049), 2048),
    ((17,) * 50, 100),
    ((1, 99, 1, 99), 7),
    ((0, 5, 0, 0, 5, 0, 20, 0), 10),
])
def test_every_row_is_in_exactly_one_shard(row_groups, max_rows):
    info = info_of(row_groups, row_groups[::-1])

    shards = plan_shards(info, max_rows_per_shard=max_rows)

    for file_index, input_file in enumerate(info.files):
        own = [s for s in shards if s.file_index == file_index]
        assert sum(s.num_rows for s in own) == input_file.num_rows
        assert own[0].row_start == 0
        for before, after in zip(own, own[1:]):  # contiguous, no gap, no overlap
            assert after.row_start == before.row_start + before.num_rows
        assert all(0 < s.num_rows <= max_rows for s in own)
        assert all(s.url == input_file.url for s in own)
        assert all(s.row_groups == tuple(range(s.row_groups[0], s.row_groups[-1] + 1)) for s in own)


def test_row_start_lies_inside_the_shard_row_groups():
    rows = (5000, 7, 3000, 1)
    starts = [0, 5000, 5007, 8007]
    for shard in plan_shards(info_of(rows), max_rows_per_shard=2048):
        first, last = shard.row_groups[0], shard.row_groups[-1]
        assert starts[first] <= shard.row_start
        assert shard.row_start + shard.num_rows <= starts[last] + rows[last]


def test_planning_twice_is_equal():
    info = info_of((5000, 7, 3000), (1, 2, 3))
    assert plan_shards(info, max_rows_per_shard=100) == plan_shards(info, max_rows_per_shard=100)
    assert isinstance(plan_shards(info)[0], ShardPlan)


def test_bad_limit_and_inconsistent_footer_are_rejected():
    with pytest.raises(ValueError, match="max_rows_per_shard must be at least 1, got 0"):
        plan_shards(info_of((1,)), max_rows_per_shard=0)
    with pytest.raises(ValueError, match="row groups hold 3 rows, not 4"):
        InputFile(url="x", num_rows=4, num_row_groups=2, row_group_rows=(1, 2))
