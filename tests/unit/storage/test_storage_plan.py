"""plan_shards: a pure function of footer row counts, table-tested on fabricated footers."""

from __future__ import annotations

import itertools
import json

import pyarrow as pa
import pytest

from storage import InputFile, InputInfo, ShardPlan, plan_shards
from storage.plan import ShardPiece


def info_of(*files_row_groups: tuple[int, ...]) -> InputInfo:
    files = tuple(
        InputFile(url=f"memory://in/{i}.parquet", num_rows=sum(rows), num_row_groups=len(rows), row_group_rows=rows)
        for i, rows in enumerate(files_row_groups)
    )
    return InputInfo(files=files, schema=pa.schema([("text", pa.string())]), num_rows=sum(f.num_rows for f in files))


# Each case: row groups per file, max_rows_per_shard -> each shard's pieces, (file_index, row_groups, row_start, num_rows).
CASES = {
    "row groups grouped up to the limit": (
        [(3, 3, 3, 3)], 6,
        [[(0, (0, 1), 0, 6)], [(0, (2, 3), 6, 6)]],
    ),
    "a group that does not fit starts a new shard": (
        [(4, 3, 2)], 6,
        [[(0, (0,), 0, 4)], [(0, (1, 2), 4, 5)]],
    ),
    "exactly the limit": (
        [(6,)], 6,
        [[(0, (0,), 0, 6)]],
    ),
    "big row group split by row range into near-equal pieces, the last packed with the next group": (
        [(2, 13, 1)], 6,
        [[(0, (0,), 0, 2)], [(0, (1,), 2, 5)], [(0, (1,), 7, 4)], [(0, (1,), 11, 4), (0, (2,), 15, 1)]],
    ),
    "small files pack into one shard": (
        [(2,), (2, 2)], 10,
        [[(0, (0,), 0, 2), (1, (0, 1), 0, 4)]],
    ),
    "many tiny files fill shards up to the limit": (
        [(1,)] * 5, 2,
        [[(0, (0,), 0, 1), (1, (0,), 0, 1)], [(2, (0,), 0, 1), (3, (0,), 0, 1)], [(4, (0,), 0, 1)]],
    ),
    "empty files and empty row groups yield nothing": (
        [(), (0,), (0, 3, 0, 2)], 10,
        [[(2, (1, 2, 3), 0, 5)]],
    ),
    "limit of one row": (
        [(2, 1)], 1,
        [[(0, (0,), 0, 1)], [(0, (0,), 1, 1)], [(0, (1,), 2, 1)]],
    ),
}


def layout(shards: list[ShardPlan]) -> list[list[tuple]]:
    return [[(p.file_index, p.row_groups, p.row_start, p.num_rows) for p in shard.pieces] for shard in shards]


@pytest.mark.parametrize("files, max_rows, expected", CASES.values(), ids=CASES.keys())
def test_plan_table(files, max_rows, expected):
    shards = plan_shards(info_of(*files), max_rows_per_shard=max_rows)
    assert layout(shards) == expected
    assert [s.shard_index for s in shards] == list(range(len(expected)))


@pytest.mark.parametrize("row_groups, max_rows", [
    ((1000, 1000, 1000), 2048),
    ((5000, 7, 3000, 1, 1, 2048, 2049), 2048),
    ((17,) * 50, 100),
    ((1, 99, 1, 99), 7),
    ((0, 5, 0, 0, 5, 0, 20, 0), 10),
])
def test_every_row_is_in_exactly_one_shard(row_groups, max_rows):
    info = info_of(row_groups, row_groups[::-1], (1,), (), (2,))

    shards = plan_shards(info, max_rows_per_shard=max_rows)

    assert all(0 < s.num_rows <= max_rows for s in shards)
    pieces = [piece for shard in shards for piece in shard.pieces]
    assert [p.global_row_start for p in pieces] == list(itertools.accumulate([0] + [p.num_rows for p in pieces[:-1]]))
    for file_index, input_file in enumerate(info.files):
        own = [p for p in pieces if p.file_index == file_index]
        assert sum(p.num_rows for p in own) == input_file.num_rows
        assert not own or own[0].row_start == 0
        for before, after in zip(own, own[1:]):  # contiguous, no gap, no overlap
            assert after.row_start == before.row_start + before.num_rows
        assert all(p.url == input_file.url for p in own)
        assert all(p.row_groups == tuple(range(p.row_groups[0], p.row_groups[-1] + 1)) for p in own)


def test_row_start_lies_inside_the_piece_row_groups_and_split_pieces_are_marked():
    rows = (5000, 7, 3000, 1)
    starts = [0, 5000, 5007, 8007]
    pieces = [piece for shard in plan_shards(info_of(rows), max_rows_per_shard=2048) for piece in shard.pieces]
    for piece in pieces:
        first, last = piece.row_groups[0], piece.row_groups[-1]
        assert starts[first] <= piece.row_start
        assert piece.row_start + piece.num_rows <= starts[last] + rows[last]
    assert [p.row_groups for p in pieces if p.is_split] == [(0,)] * 3 + [(2,)] * 2


def test_a_plan_survives_its_json_and_plans_stored_before_pieces_still_load():
    shards = plan_shards(info_of((3, 3), (2,)), max_rows_per_shard=10)
    assert [ShardPlan.from_dict(json.loads(json.dumps(s.to_dict()))) for s in shards] == shards
    legacy = {"shard_index": 4, "file_index": 2, "url": "/in/c.parquet", "row_groups": [1], "row_start": 40,
              "num_rows": 20, "work": 7, "partition": {"day": "1"}, "global_row_start": 140}
    old = ShardPlan.from_dict(legacy)
    assert (old.shard_index, old.num_rows, old.work, old.file_index) == (4, 20, 7, 2)
    assert old.pieces[0] == ShardPiece(file_index=2, url="/in/c.parquet", row_groups=(1,), row_start=40, num_rows=20,
                                       global_row_start=140, work=7, partition={"day": "1"})


def test_planning_twice_is_equal():
    info = info_of((5000, 7, 3000), (1, 2, 3))
    assert plan_shards(info, max_rows_per_shard=100) == plan_shards(info, max_rows_per_shard=100)
    assert isinstance(plan_shards(info)[0], ShardPlan)


def test_bad_limit_and_inconsistent_footer_are_rejected():
    with pytest.raises(ValueError, match="max_rows_per_shard must be at least 1, got 0"):
        plan_shards(info_of((1,)), max_rows_per_shard=0)
    with pytest.raises(ValueError, match="row groups hold 3 rows, not 4"):
        InputFile(url="x", num_rows=4, num_row_groups=2, row_group_rows=(1, 2))
