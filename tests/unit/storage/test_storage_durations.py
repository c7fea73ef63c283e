"""Audio seconds from container headers (storage.durations) on real audio: the ALSA clips,
espeak-ng speech and sox tones, as WAV, FLAC, MP3, Ogg/Opus and M4A, checked against
sox's own reading of the same files (`soxi -D`); a job over files of very different
lengths plans shards of similar audio seconds; an unreadable file weighs a second and is
counted, never a failed plan."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from storage import inspect_input, plan_shards
from storage.durations import audio_seconds, row_seconds, with_durations
from storage.plan import split_rows
from tests.support.audio_files import encode

ALSA = Path("/usr/share/sounds/alsa")
pytestmark = pytest.mark.skipif(not shutil.which("sox") or not ALSA.is_dir(), reason="needs sox and the ALSA clips")


def soxi_seconds(path: Path) -> float:
    return float(subprocess.run(["soxi", "-D", str(path)], capture_output=True, text=True, check=True).stdout)


def tone(path: Path, seconds: float) -> Path:
    """A real WAV of `seconds` made by sox (16 kHz mono)."""
    subprocess.run(["sox", "-n", "-r", "16000", "-c", "1", str(path), "synth", str(seconds), "sine", "440"], check=True)
    return path


def test_header_durations_equal_sox_on_real_clips_and_speech(tmp_path):
    clips = [ALSA / "Front_Center.wav", ALSA / "Noise.wav", ALSA / "Rear_Left.wav"]
    speech = tmp_path / "speech.wav"
    subprocess.run(["espeak-ng", "-w", str(speech), "A barge moves slowly down the wide river at night."], check=True)
    for path in [*clips, speech, tone(tmp_path / "tone.wav", 37.5)]:
        expected = soxi_seconds(path)
        assert audio_seconds(str(path)) == pytest.approx(expected, abs=0.01), path
        assert audio_seconds(path.read_bytes()) == pytest.approx(expected, abs=0.01), path


@pytest.mark.parametrize("kind", ["flac", "mp3", "ogg", "m4a"])
def test_compressed_containers_give_their_duration_without_decoding(kind):
    seconds = audio_seconds(encode(np.zeros(16_000 * 12, np.float32), kind))   # 12 s encoded by FFmpeg
    assert seconds == pytest.approx(12.0, abs=0.2), kind   # encoder padding and frame rounding only


def test_what_is_not_audio_has_no_duration(tmp_path):
    (tmp_path / "notes.txt").write_text("not audio")
    assert audio_seconds(b"not audio at all") is None
    assert audio_seconds(str(tmp_path / "notes.txt")) is None
    assert audio_seconds(str(tmp_path / "missing.wav")) is None
    assert audio_seconds(None) is None and audio_seconds(b"") is None
    assert row_seconds(None) == 1 and row_seconds(0.2) == 1 and row_seconds(37.5) == 38


def test_split_rows_fills_ranges_by_work_within_both_limits():
    assert split_rows((40, 5, 5, 30, 1, 60, 2), max_rows=10, max_work=50) == [
        (0, 3, 50), (3, 2, 31), (5, 1, 60), (6, 1, 2)]   # a single row over the limit is its own range
    assert split_rows((1,) * 7, max_rows=3, max_work=50) == [(0, 3, 3), (3, 3, 3), (6, 1, 1)]


LENGTHS = [2, 45, 1, 1, 30, 3, 58, 2, 1, 20, 40, 5, 1, 1, 50, 4, 2, 35, 1, 12]   # seconds, 20 files


def test_files_of_very_different_lengths_plan_shards_of_similar_audio_seconds(tmp_path):
    paths = [tone(tmp_path / f"clip{i:02d}.wav", seconds) for i, seconds in enumerate(LENGTHS)]
    paths.insert(7, tmp_path / "broken.wav")
    paths[7].write_bytes(b"RIFF this is not a wave file")
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": list(range(len(paths))), "audio": [str(p) for p in paths]}),
                   tmp_path / "in" / "audio.parquet")   # one row group: the planner cuts it by audio
    info = inspect_input(str(tmp_path / "in"), columns={"audio_column": "audio", "id_column": "id"})

    timed, durations = with_durations(info, "audio")
    by_audio = plan_shards(timed, max_rows_per_shard=64, max_work_per_shard=120)
    by_rows = plan_shards(info, max_rows_per_shard=3)

    real = {str(p): (soxi_seconds(p) if p.name != "broken.wav" else None) for p in paths}
    audio = [str(p) for p in paths]

    def rows_of(shard):
        return [audio[piece.row_start + i] for piece in shard.pieces for i in range(piece.num_rows)]

    def seconds_of(shards):
        return [sum(real[a] or 0.0 for a in rows_of(shard)) for shard in shards]

    audio_shards, row_shards = seconds_of(by_audio), seconds_of(by_rows)
    print(f"\nby audio (<= 120 s): {[round(s) for s in audio_shards]}; by rows (3 a shard): "
          f"{[round(s) for s in row_shards]}")
    assert durations.num_unknown == 1 and durations.total_seconds == pytest.approx(sum(LENGTHS), abs=0.1)
    assert sum(shard.num_rows for shard in by_audio) == len(paths)   # the broken file is planned, not dropped
    assert max(audio_shards) <= 120 + 0.5 * len(paths)   # each row rounded to a whole second
    # A shard closes only when the next file would not fit: each but the last holds more than
    # the limit less the longest file.
    full = audio_shards[:-1]
    assert len(by_audio) == 4 and min(full) > 120 - max(LENGTHS) - 1, "shards of similar audio seconds"
    assert max(row_shards) >= 3 * min(row_shards), "by rows alone they would not be"
    assert all(shard.work == sum(row_seconds(real[a]) for a in rows_of(shard)) for shard in by_audio)
