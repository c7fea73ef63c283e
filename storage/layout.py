"""The layout planning found, in numbers a user can act on (`barge submit --dry-run`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from storage.ids import IdSummary
from storage.inputs import InputInfo
from storage.plan import ShardPlan


@dataclass(frozen=True)
class Layout:
    num_files: int
    num_empty_files: int
    num_rows: int
    num_row_groups: int
    largest_row_group_rows: int
    num_bytes: int  # the input files' sizes
    num_read_bytes: int  # of which the footers and the chunks of the columns the job reads: what shards fetch
    num_shards: int
    num_packed_files: int  # files whose rows share a shard with another file's
    num_split_row_groups: int  # row groups bigger than a shard: staged once before the job runs
    ids: IdSummary | None = None

    def to_dict(self) -> dict:
        """JSON-ready, without the ids (the job's report keeps their counts)."""
        return {name: value for name, value in asdict(self).items() if name != "ids"}

    @classmethod
    def from_dict(cls, data: dict) -> Layout:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name != "ids"})

    def describe(self) -> str:
        lines = [
            f"input: {self.num_files:,} files ({self.num_empty_files:,} empty), {self.num_rows:,} rows, "
            f"{self.num_bytes / 1e6:,.1f} MB, of which {self.num_read_bytes / 1e6:,.1f} MB to be read "
            "(footers and the columns the job reads)",
            f"row groups: {self.num_row_groups:,}, the largest {self.largest_row_group_rows:,} rows",
            f"shards: {self.num_shards:,} (one output part each); {self.num_packed_files:,} files packed "
            f"several to a shard",
            f"row groups bigger than a shard: {self.num_split_row_groups:,}"
            + (" (each read once into staged files before the job runs)" if self.num_split_row_groups else ""),
        ]
        if self.ids is not None:
            duplicates = self.ids.describe_duplicates() if self.ids.num_duplicate_rows else "none"
            lines.append(f"ids: {self.ids.num_null:,} null (error rows), duplicates: {duplicates}")
        return "\n".join(lines)


def describe_layout(info: InputInfo, shards: list[ShardPlan]) -> Layout:
    files_in_shards = [{piece.file_index for piece in shard.pieces} for shard in shards]
    packed = set().union(*(files for files in files_in_shards if len(files) > 1))
    split = {(piece.file_index, piece.row_groups[0]) for shard in shards for piece in shard.pieces if piece.is_split}
    return Layout(num_files=len(info.files), num_empty_files=sum(1 for f in info.files if f.num_rows == 0),
                  num_rows=info.num_rows, num_row_groups=sum(f.num_row_groups for f in info.files),
                  largest_row_group_rows=max((n for f in info.files for n in f.row_group_rows), default=0),
                  num_bytes=sum(f.num_bytes for f in info.files),
                  num_read_bytes=sum(f.num_read_bytes for f in info.files), num_shards=len(shards),
                  num_packed_files=len(packed), num_split_row_groups=len(split), ids=info.ids)
