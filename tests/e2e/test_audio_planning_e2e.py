"""A transcribe job over files of very different lengths, through a real deployment (embedded
broker and SQLite, a worker process serving the real Whisper tiny.en): planning reads each
file's duration from its header and cuts shards of similar audio seconds, a file whose
duration cannot be read is an error row (not a failed plan), and `barge status` gives the
progress in audio seconds."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli.main import main as barge
from jobs import JobSpec, JobStatus
from tests.support.speech import SENTENCES, espeak, has_espeak, silence, write_wav
from tests.support.stack import stack

pytestmark = pytest.mark.skipif(not has_espeak(), reason="needs espeak-ng")

SENTENCES_PER_FILE = [1, 7, 1, 1, 5, 2, 1, 6, 1, 3]   # about 3 s to 25 s of speech a file
MAX_AUDIO_S = 30


def test_files_of_very_different_lengths_run_in_shards_of_similar_audio_seconds(tmp_path, monkeypatch, capsys):
    paths, start = [], 0
    (tmp_path / "media").mkdir()
    for i, count in enumerate(SENTENCES_PER_FILE):
        parts = [piece for s in SENTENCES[start:start + count] for piece in (espeak(s), silence(0.3))]
        paths.append(str(write_wav(tmp_path / "media" / f"talk-{i}.wav", np.concatenate(parts))))
        start += count
    paths.insert(4, str(tmp_path / "media" / "broken.wav"))
    (tmp_path / "media" / "broken.wav").write_bytes(b"RIFF....WAVE but nothing after")
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"doc_id": list(range(len(paths))), "audio": paths}), tmp_path / "in" / "a.parquet")

    with stack("embedded", tmp_path / "barge") as deployment:
        deployment.start_worker(model="whisper-tiny.en", env={"OMP_NUM_THREADS": "1"})
        client = deployment.client()
        job = client.submit(JobSpec(mode="transcribe", model="whisper-tiny.en", input=str(tmp_path / "in"),
                                    input_column="audio", id_column="doc_id", output=str(tmp_path / "out"),
                                    params={"language": "en"}, max_audio_seconds_per_shard=MAX_AUDIO_S))
        state = job.wait(timeout=600)
        assert state.status == JobStatus.SUCCEEDED, deployment.worker_logs()
        shards = client.store.list_shards(job.id)
        for name, value in deployment.env.items():   # `barge status` finds this deployment
            monkeypatch.setenv(name, value)
        capsys.readouterr()
        assert barge(["status", job.id]) == 0
        status = capsys.readouterr().out

    rows = {row["doc_id"]: row for row in job.results().to_pylist()}
    assert len(rows) == len(paths) and (state.rows_succeeded, state.rows_failed) == (len(paths) - 1, 1)
    assert rows[4]["error"] and rows[4]["text"] is None   # the broken file: an error row, planned like the others
    # The audio each shard ran, as the worker decoded it (duration_s), not as planning read it.
    decoded = []
    for shard in sorted(shards, key=lambda s: s.shard_index):
        ids = [piece["global_row_start"] + i for piece in shard.plan["pieces"] for i in range(piece["num_rows"])]
        decoded.append(sum(rows[i]["duration_s"] or 0.0 for i in ids))
    longest = max(rows[i]["duration_s"] or 0.0 for i in rows)
    print(f"\naudio seconds per shard (<= {MAX_AUDIO_S} s): {[round(s, 1) for s in decoded]}; longest file "
          f"{longest:.1f} s\n{status}")
    assert len(shards) >= 3
    assert max(decoded) <= MAX_AUDIO_S + 0.5 * len(paths)   # planned in whole seconds a file
    assert min(decoded[:-1]) > MAX_AUDIO_S - longest - 1, "a shard closes only when the next file does not fit"
    total = sum(shard.plan["work"] for shard in shards)
    assert f"audio: {total:,} s done of {total:,} s (100%) (1 file of unknown duration)" in status
    assert "plan:\n    input: 1 files (0 empty), 11 rows" in status
