"""Audio seconds per row, read from each file's container header at planning: shards of a
transcribe job are then bounded by audio, not rows (a shard of 200 one-hour podcasts and
one of 200 voice notes are not the same work).

Only the header is read, never decoded: PyAV (FFmpeg) gives the container's duration,
or the audio stream's when the container has none. The audio column is read once for
it (a path column: the paths, then each file's header; a bytes column: the bytes
themselves, since the header is inside each value). A row whose duration cannot be read
(not audio, missing, null) weighs UNKNOWN_SECONDS and is counted; its row becomes an
error row when the worker decodes it, as it always did (engine.whisper.audio), never a
failed plan.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import fsspec
import pyarrow as pa

from storage.errors import InputError
from storage.footer import open_parquet, read_footer
from storage.fs import describe, redact, resolve
from storage.inputs import InputFile, InputInfo
from storage.work import AUDIO_SECONDS

UNKNOWN_SECONDS = 1  # the weight of a row without a readable duration: it fails fast
MAX_CONCURRENT_HEADERS = 16
AUDIO_BATCH_ROWS = 64
_AV_TIME_BASE = 1_000_000  # FFmpeg's AV_TIME_BASE: container.duration is in microseconds


@dataclass(frozen=True)
class Durations:
    num_rows: int = 0
    num_unknown: int = 0  # rows whose duration could not be read
    total_seconds: float = 0.0  # of the rows whose duration was read


def audio_seconds(source: bytes | str | None) -> float | None:
    """The duration of one row's audio (bytes, or a path or fsspec URL) from its header; None if unreadable."""
    if not source:
        return None
    try:
        if isinstance(source, (bytes, bytearray, memoryview)):
            return _header_seconds(io.BytesIO(bytes(source)))
        with fsspec.open(source, "rb") as file:
            return _header_seconds(file)
    except Exception:  # noqa: BLE001 - FFmpeg and every fsspec backend raise their own kinds
        return None


def _header_seconds(file) -> float | None:
    import av
    with av.open(file, mode="r", metadata_errors="ignore") as container:
        if not container.streams.audio:
            return None
        if container.duration is not None and container.duration > 0:
            return container.duration / _AV_TIME_BASE
        stream = container.streams.audio[0]
        if stream.duration is not None and stream.time_base is not None:
            return float(stream.duration * stream.time_base)
    return None


def row_seconds(seconds: float | None) -> int:
    """A row's work in whole audio seconds (at least 1), as the planner counts it."""
    return UNKNOWN_SECONDS if seconds is None else max(1, round(seconds))


def with_durations(info: InputInfo, audio_column: str,
                   storage_options: dict | None = None) -> tuple[InputInfo, Durations]:
    """`info` with each file's work (per row and per row group) in audio seconds from the headers."""
    files, num_unknown, total = [], 0, 0.0
    with ThreadPoolExecutor(max_workers=MAX_CONCURRENT_HEADERS) as pool:
        for input_file in info.files:
            seconds = [s for values in _audio_batches(input_file, audio_column, storage_options)
                       for s in pool.map(audio_seconds, values)]
            num_unknown += sum(1 for s in seconds if s is None)
            total += sum(s for s in seconds if s is not None)
            files.append(_with_row_work(input_file, [row_seconds(s) for s in seconds]))
    return replace(info, files=tuple(files), work_unit=AUDIO_SECONDS), Durations(info.num_rows, num_unknown, total)


def _with_row_work(input_file: InputFile, row_work: list[int]) -> InputFile:
    group_work, start = [], 0
    for num_rows in input_file.row_group_rows:
        group_work.append(sum(row_work[start:start + num_rows]))
        start += num_rows
    return replace(input_file, row_work=tuple(row_work), row_group_work=tuple(group_work))


def _audio_batches(input_file: InputFile, audio_column: str, storage_options: dict | None) -> Iterator[list]:
    """The file's audio column (bytes or paths) as Python values, in row order, AUDIO_BATCH_ROWS at a time:
    audio bytes are held a batch at a time."""
    if not input_file.num_rows:
        return
    fs, path = resolve(input_file.url, storage_options)
    num_rows = 0
    try:
        with open_parquet(fs, path, read_footer(fs, path, input_file.url, input_file.num_bytes)) as parquet_file:
            for batch in parquet_file.iter_batches(batch_size=AUDIO_BATCH_ROWS, columns=[audio_column],
                                                   use_threads=False):
                num_rows += batch.num_rows
                yield batch.column(0).to_pylist()
    except (pa.ArrowException, OSError) as error:
        raise InputError(f"{redact(input_file.url)}: cannot read column {audio_column!r} for the audio's durations "
                         f"({describe(error, storage_options)})") from error
    if num_rows != input_file.num_rows:
        raise InputError(f"{redact(input_file.url)}: {num_rows} rows, its footer said {input_file.num_rows}")
