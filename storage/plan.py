"""Shards from Parquet footers: a pure, deterministic plan over what inspect_input found.

The plan depends on nothing but the footers' row counts and work estimates, so
planning the same input twice gives the same shards, and a re-delivered shard
task reads exactly the same rows again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from storage.inputs import InputFile, InputInfo, inspect_input, schema_difference  # noqa: F401 - re-exported

DEFAULT_MAX_ROWS_PER_SHARD = 2048


@dataclass(frozen=True)
class ShardPlan:
    """A contiguous run of rows in one file: the unit of work of one shard task."""

    shard_index: int  # position in the job's plan, 0..num_shards-1 over all files
    file_index: int  # index into InputInfo.files
    url: str
    row_groups: tuple[int, ...]  # consecutive row group indices that hold the rows
    row_start: int  # offset within the file of this shard's first row
    num_rows: int
    work: int = 0  # estimated work, in InputInfo.work_unit; 0 when the footers gave no estimate
    # the file's hive partition (key -> value); read_shard(partition_columns=True) adds it as columns
    partition: dict[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class _Range:
    """One shard's rows within a file, before shards are numbered across files."""

    row_groups: tuple[int, ...]
    row_start: int
    num_rows: int
    work: int


def plan_shards(info: InputInfo, *, max_rows_per_shard: int = DEFAULT_MAX_ROWS_PER_SHARD,
                max_work_per_shard: int | None = None) -> list[ShardPlan]:
    """Cut every file into shards of at most `max_rows_per_shard` rows and `max_work_per_shard` work.

    Shards follow row-group boundaries: consecutive row groups are grouped while
    both limits hold. A row group over either limit becomes shards of its own, split
    by row range into near-equal pieces (its work taken as spread evenly over its
    rows; a single row over the work limit still makes a shard). Empty row groups
    start no shard. Every row of every file is in exactly one shard. With
    `max_work_per_shard=None`, or footers without work estimates, only rows count.
    """
    if max_rows_per_shard < 1:
        raise ValueError(f"max_rows_per_shard must be at least 1, got {max_rows_per_shard}")
    if max_work_per_shard is not None and max_work_per_shard < 1:
        raise ValueError(f"max_work_per_shard must be at least 1 or None, got {max_work_per_shard}")
    shards: list[ShardPlan] = []
    for file_index, input_file in enumerate(info.files):
        for piece in _file_ranges(input_file, max_rows_per_shard, max_work_per_shard):
            shards.append(ShardPlan(shard_index=len(shards), file_index=file_index, url=input_file.url,
                                    row_groups=piece.row_groups, row_start=piece.row_start,
                                    num_rows=piece.num_rows, work=piece.work, partition=dict(input_file.partition)))
    return shards


def _file_ranges(input_file: InputFile, max_rows: int, max_work: int | None) -> list[_Range]:
    """The shards of one file, in row order."""
    work = input_file.row_group_work or (0,) * input_file.num_row_groups
    max_work = max_work if max_work is not None and input_file.row_group_work else None
    ranges: list[_Range] = []
    pending: list[int] = []  # row groups gathered for the next shard
    pending_start = pending_rows = pending_work = 0
    row_group_start = 0  # offset in the file of the current row group's first row
    for index, (num_rows, group_work) in enumerate(zip(input_file.row_group_rows, work)):
        if pending and not _fits(pending_rows + num_rows, pending_work + group_work, max_rows, max_work):
            ranges.append(_Range(tuple(pending), pending_start, pending_rows, pending_work))
            pending, pending_rows, pending_work = [], 0, 0
        if not _fits(num_rows, group_work, max_rows, max_work):
            ranges.extend(_split_group(index, row_group_start, num_rows, group_work, max_rows, max_work))
        elif num_rows > 0 or pending:  # an empty group inside a run keeps the run consecutive
            if not pending:
                pending_start = row_group_start
            pending.append(index)
            pending_rows += num_rows
            pending_work += group_work
        row_group_start += num_rows
    if pending:
        ranges.append(_Range(tuple(pending), pending_start, pending_rows, pending_work))
    return ranges


def _fits(num_rows: int, work: int, max_rows: int, max_work: int | None) -> bool:
    return num_rows <= max_rows and (max_work is None or work <= max_work)


def _split_group(index: int, group_start: int, num_rows: int, work: int,
                 max_rows: int, max_work: int | None) -> list[_Range]:
    """A row group over a limit, as the fewest near-equal row ranges within both limits."""
    rows_per_piece = max_rows
    if max_work is not None and work > 0:
        # Work is taken as even over the rows, so this many rows stay within max_work.
        rows_per_piece = min(max_rows, max(1, max_work * num_rows // work))
    num_pieces = -(-num_rows // rows_per_piece)
    ranges = []
    for offset, size in _split(num_rows, num_pieces):
        # Integer shares of the group's work that add up to exactly its total.
        piece_work = work * (offset + size) // num_rows - work * offset // num_rows
        ranges.append(_Range((index,), group_start + offset, size, piece_work))
    return ranges


def _split(num_rows: int, num_pieces: int) -> list[tuple[int, int]]:
    """(offset, size) of `num_pieces` near-equal pieces of `num_rows` rows."""
    base, remainder = divmod(num_rows, num_pieces)
    pieces, offset = [], 0
    for piece in range(num_pieces):
        size = base + (1 if piece < remainder else 0)
        pieces.append((offset, size))
        offset += size
    return pieces
