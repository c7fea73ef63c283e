"""A transcribe job's dry run plans by audio seconds, as planning does (storage.durations):
real WAV files made by sox, the real Whisper tiny.en resolved as submit resolves it."""

from __future__ import annotations

import shutil
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.dry_run import dry_run
from jobs.spec import JobSpec, JobSpecError

pytestmark = pytest.mark.skipif(not shutil.which("sox"), reason="needs sox")


@pytest.fixture(autouse=True)
def only_builtin_models(monkeypatch, tmp_path):
    monkeypatch.delenv("BARGE_MODELS", raising=False)
    monkeypatch.delenv("BARGE_MODELS_FILE", raising=False)
    monkeypatch.setenv("BARGE_DATA_DIR", str(tmp_path / "barge"))


def test_a_transcribe_dry_run_cuts_shards_by_audio_seconds(tmp_path):
    paths = []
    for i, seconds in enumerate([50, 50, 50, 5]):
        path = tmp_path / f"tone{i}.wav"
        subprocess.run(["sox", "-n", "-r", "16000", "-c", "1", str(path), "synth", str(seconds), "sine", "300"],
                       check=True)
        paths.append(str(path))
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"audio": paths}), tmp_path / "in" / "a.parquet")
    spec = dict(mode="transcribe", model="whisper-tiny.en", input=str(tmp_path / "in"), input_column="audio",
                output=str(tmp_path / "out"))
    assert dry_run(JobSpec(**spec, max_audio_seconds_per_shard=60)).num_shards == 3   # 50 | 50 | 50 + 5
    assert dry_run(JobSpec(**spec, max_audio_seconds_per_shard=120)).num_shards == 2   # 50 + 50 | 50 + 5
    assert dry_run(JobSpec(**spec)).num_shards == 1   # the default, 1,800 s, holds all 155 s
    with pytest.raises(JobSpecError, match="max_audio_seconds_per_shard: must be a positive integer"):
        JobSpec(**spec, max_audio_seconds_per_shard=0)
