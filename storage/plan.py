r"""Shards from Parquet footers: a pure, deterministic plan over what inspect_input found.

The plan depends on nothing but the footers' row counts and work estimates, so
planning the same input twice gives the same shards, and a re-delivered shard
task reads exactly the same rows again.

NOTE: a shard is a list of pieces, each a row range of one file, so a shard may
span files: many small files pack into few shards (and few output parts). A row
group over a shard's limits is cut into row-range pieces, each its own shard;
those pieces are `is_split`, and storage.stage re-lays them into staged files
before the job runs so that the row group is fetched once, not once per piece.

    file 0 (3 tiny row groups)  file 1 (1 tiny)   file 2 (one huge row group)
    [g0 g1 g2]                  [g0]              [g0 ........................]
    \________ shard 0 _____________/              \_ s1 _/\_ s2 _/\_ s3 _/  split pieces
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from storage.inputs import InputFile, InputInfo, inspect_input, schema_difference  # noqa: F401 - re-exported

DEFAULT_MAX_ROWS_PER_SHARD = 2048


@dataclass(frozen=True)
class ShardPiece:
    """A contiguous run of rows of one input file."""

    file_index: int  # index into InputInfo.files
    url: str  # the input file
    row_groups: tuple[int, ...]  # consecutive row group indices of the input file that hold the rows
    row_start: int  # offset within the input file of the piece's first row
    num_rows: int
    global_row_start: int = 0  # offset of the piece's first row in the whole input (files in order)
    work: int = 0  # estimated work, in InputInfo.work_unit; 0 when the footers gave no estimate
    file_bytes: int = 0  # the input file's size; 0 when unknown
    # the file's hive partition (key -> value); read_shard(partition_columns=True) adds it as columns
    partition: dict[str, str | None] = field(default_factory=dict)
    is_split: bool = False  # a row range of a row group bigger than a shard
    # set by storage.stage (a file holding exactly this piece's rows) or storage.bundle (a shard's small
    # files in one staged file): the piece's rows are that file's rows staged_row_start.. on
    staged_url: str | None = None
    staged_row_start: int = 0


@dataclass(frozen=True)
class ShardPlan:
    """The unit of work of one shard task: pieces of one or more files, in input order."""

    shard_index: int  # position in the job's plan, 0..num_shards-1
    pieces: tuple[ShardPiece, ...]

    @property
    def num_rows(self) -> int:
        return sum(piece.num_rows for piece in self.pieces)

    @property
    def work(self) -> int:
        return sum(piece.work for piece in self.pieces)

    @property
    def file_index(self) -> int:
        """The shard's first input file (part names carry it)."""
        return self.pieces[0].file_index

    def to_dict(self) -> dict:
        """JSON-ready, as the shards table stores it (`num_rows` read by the store)."""
        pieces = [dict(asdict(piece), row_groups=list(piece.row_groups)) for piece in self.pieces]
        return {"shard_index": self.shard_index, "num_rows": self.num_rows, "work": self.work, "pieces": pieces}

    @classmethod
    def from_dict(cls, plan: dict) -> ShardPlan:
        """A stored plan; plans stored before shards had pieces are one piece of one file."""
        if "pieces" not in plan:
            legacy = {name: plan[name] for name in ("file_index", "url", "row_groups", "row_start", "num_rows")}
            plan = {"shard_index": plan["shard_index"],
                    "pieces": [dict(legacy, work=plan.get("work", 0), partition=plan.get("partition", {}),
                                    global_row_start=plan.get("global_row_start", 0))]}
        pieces = tuple(ShardPiece(**dict(piece, row_groups=tuple(piece["row_groups"]))) for piece in plan["pieces"])
        return cls(shard_index=plan["shard_index"], pieces=pieces)


def plan_shards(info: InputInfo, *, max_rows_per_shard: int = DEFAULT_MAX_ROWS_PER_SHARD,
                max_work_per_shard: int | None = None) -> list[ShardPlan]:
    """Cut the input into shards of at most `max_rows_per_shard` rows and `max_work_per_shard` work.

    Pieces follow row-group boundaries: consecutive row groups of a file are
    grouped while both limits hold, and consecutive pieces, of one file or of
    several, are packed into a shard while both limits hold. A row group over
    either limit becomes pieces of its own, split by row range into near-equal
    shards (its work taken as spread evenly over its rows, or, when a file knows its
    work per row (`row_work`: audio seconds), cut greedily by it; a single row over
    the work limit still makes a shard). Empty files and row groups give no piece.
    Every row of every file is in exactly one shard. With `max_work_per_shard=None`,
    or footers without work estimates, only rows count.
    """
    if max_rows_per_shard < 1:
        raise ValueError(f"max_rows_per_shard must be at least 1, got {max_rows_per_shard}")
    if max_work_per_shard is not None and max_work_per_shard < 1:
        raise ValueError(f"max_work_per_shard must be at least 1 or None, got {max_work_per_shard}")
    pieces, global_start = [], 0
    for file_index, input_file in enumerate(info.files):
        for piece in _file_pieces(input_file, max_rows_per_shard, max_work_per_shard):
            pieces.append(replace(piece, file_index=file_index, global_row_start=global_start + piece.row_start))
        global_start += input_file.num_rows
    return _pack(pieces, max_rows_per_shard, max_work_per_shard)


def _pack(pieces: list[ShardPiece], max_rows: int, max_work: int | None) -> list[ShardPlan]:
    """Consecutive pieces into shards, greedily, while both limits hold."""
    shards: list[ShardPlan] = []
    pending: list[ShardPiece] = []
    for piece in pieces:
        rows = sum(p.num_rows for p in pending) + piece.num_rows
        work = sum(p.work for p in pending) + piece.work
        if pending and not _fits(rows, work, max_rows, max_work):
            shards.append(ShardPlan(len(shards), tuple(pending)))
            pending = []
        pending.append(piece)
    if pending:
        shards.append(ShardPlan(len(shards), tuple(pending)))
    return shards


def _file_pieces(input_file: InputFile, max_rows: int, max_work: int | None) -> list[ShardPiece]:
    """The pieces of one file, in row order (file_index and global_row_start left to the caller)."""
    work = input_file.row_group_work or (0,) * input_file.num_row_groups
    max_work = max_work if max_work is not None and input_file.row_group_work else None
    pieces: list[ShardPiece] = []
    pending: list[int] = []  # row groups gathered for the next piece
    pending_start = pending_rows = pending_work = 0
    row_group_start = 0  # offset in the file of the current row group's first row
    for index, (num_rows, group_work) in enumerate(zip(input_file.row_group_rows, work)):
        if pending and not _fits(pending_rows + num_rows, pending_work + group_work, max_rows, max_work):
            pieces.append(_piece(input_file, pending, pending_start, pending_rows, pending_work))
            pending, pending_rows, pending_work = [], 0, 0
        if not _fits(num_rows, group_work, max_rows, max_work):
            row_work = input_file.row_work[row_group_start:row_group_start + num_rows]
            ranges = (split_rows(row_work, max_rows, max_work) if row_work and max_work is not None
                      else split_group(num_rows, group_work, max_rows, max_work))
            for offset, size, piece_work in ranges:
                pieces.append(_piece(input_file, [index], row_group_start + offset, size, piece_work, is_split=True))
        elif num_rows > 0 or pending:  # an empty group inside a run keeps the run consecutive
            if not pending:
                pending_start = row_group_start
            pending.append(index)
            pending_rows += num_rows
            pending_work += group_work
        row_group_start += num_rows
    if pending:
        pieces.append(_piece(input_file, pending, pending_start, pending_rows, pending_work))
    return pieces


def _piece(input_file: InputFile, row_groups: list[int], row_start: int, num_rows: int, work: int,
           is_split: bool = False) -> ShardPiece:
    staged = input_file.staged_url is not None and not is_split   # storage.bundle stages no split file
    return ShardPiece(file_index=0, url=input_file.url, row_groups=tuple(row_groups), row_start=row_start,
                      num_rows=num_rows, work=work, file_bytes=input_file.num_bytes,
                      partition=dict(input_file.partition), is_split=is_split,
                      staged_url=input_file.staged_url if staged else None,
                      staged_row_start=input_file.staged_row_start + row_start if staged else 0)


def _fits(num_rows: int, work: int, max_rows: int, max_work: int | None) -> bool:
    return num_rows <= max_rows and (max_work is None or work <= max_work)


def split_group(num_rows: int, work: int, max_rows: int, max_work: int | None) -> list[tuple[int, int, int]]:
    """A row group over a limit as the fewest near-equal row ranges within both limits:
    (offset in the group, num_rows, work) each."""
    rows_per_piece = max_rows
    if max_work is not None and work > 0:
        # Work is taken as even over the rows, so this many rows stay within max_work.
        rows_per_piece = min(max_rows, max(1, max_work * num_rows // work))
    num_pieces = -(-num_rows // rows_per_piece)
    base, remainder = divmod(num_rows, num_pieces)
    ranges, offset = [], 0
    for index in range(num_pieces):
        size = base + (1 if index < remainder else 0)
        # Integer shares of the group's work that add up to exactly its total.
        piece_work = work * (offset + size) // num_rows - work * offset // num_rows
        ranges.append((offset, size, piece_work))
        offset += size
    return ranges


def split_rows(row_work: tuple[int, ...], max_rows: int, max_work: int) -> list[tuple[int, int, int]]:
    """A row group over a limit, its work known per row (audio seconds), as consecutive row ranges
    filled greedily within both limits: (offset in the group, num_rows, work) each. A single row
    over max_work is a range of its own."""
    ranges: list[tuple[int, int, int]] = []
    start = work = 0
    for offset, row in enumerate(row_work):
        if offset > start and not _fits(offset - start + 1, work + row, max_rows, max_work):
            ranges.append((start, offset - start, work))
            start, work = offset, 0
        work += row
    ranges.append((start, len(row_work) - start, work))
    return ranges
