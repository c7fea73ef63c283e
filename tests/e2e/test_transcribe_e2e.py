"""Transcription jobs through a real deployment (embedded broker and SQLite, a separate
worker process serving the real Whisper tiny.en): audio as a bytes column and as a
column of file paths, bad rows beside good ones, results equal to the engine's own."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import JobSpec, JobSpecError, JobStatus
from tests.support.audio_files import encode
from tests.support.speech import ALSA_DIR, SENTENCES, espeak, silence, word_error_rate
from tests.support.stack import stack

OUTPUT_COLUMNS = ["doc_id", "text", "segments", "language", "duration_s", "error"]


def _speech(i: int):
    import numpy as np
    return np.concatenate([espeak(SENTENCES[i]), silence(1.0), espeak(SENTENCES[i + 1])])


def _write(folder, name: str, column: pa.Array) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    ids = pa.array(range(len(column)), pa.int64())
    pq.write_table(pa.table({"doc_id": ids, "audio": column}), folder / name, row_group_size=3)


def test_transcribe_jobs_on_audio_bytes_and_on_paths(tmp_path):
    clips = [encode(_speech(4), "flac"), (ALSA_DIR / "Front_Left.wav").read_bytes(), None,
             b"not audio at all", encode(_speech(13), "mp3")]
    _write(tmp_path / "bytes", "a.parquet", pa.array(clips, pa.binary()))
    files = []
    for i, clip in enumerate(clips):
        path = tmp_path / "media" / f"clip-{i}.{'mp3' if i == 4 else 'wav' if i == 1 else 'flac'}"
        path.parent.mkdir(exist_ok=True)
        if clip is not None:
            path.write_bytes(clip)
        files.append(str(path))
    _write(tmp_path / "paths", "a.parquet", pa.array(files, pa.string()))

    with stack("embedded", tmp_path / "barge") as deployment:
        deployment.start_worker(model="whisper-tiny.en", env={"OMP_NUM_THREADS": "1"})
        client = deployment.client()
        with pytest.raises(JobSpecError, match="params"):
            client.submit(JobSpec(mode="transcribe", model="whisper-tiny.en", input=str(tmp_path / "bytes"),
                                  input_column="audio", output=str(tmp_path / "bad"), params={"task": "summarize"}))
        with pytest.raises(JobSpecError, match="input_column"):
            client.submit(JobSpec(mode="transcribe", model="whisper-tiny.en", input=str(tmp_path / "bytes"),
                                  input_column="doc_id", output=str(tmp_path / "bad")))
        jobs = [client.submit(JobSpec(mode="transcribe", model="whisper-tiny.en", input=str(tmp_path / kind),
                                      input_column="audio", id_column="doc_id", output=str(tmp_path / f"out-{kind}"),
                                      params={"language": "en", "vad": True}, max_rows_per_shard=3))
                for kind in ("bytes", "paths")]
        for job in jobs:
            state = job.wait(timeout=300)
            assert state.status == JobStatus.SUCCEEDED, deployment.worker_logs()
            assert (state.rows_total, state.rows_succeeded, state.rows_failed) == (5, 3, 2)

    by_bytes, by_path = (job.results().sort_by("doc_id") for job in jobs)
    assert by_bytes.schema.names == by_path.schema.names == OUTPUT_COLUMNS
    assert by_bytes.schema.field("segments").type == pa.list_(
        pa.struct([("start", pa.float64()), ("end", pa.float64()), ("text", pa.string())]))
    for table in (by_bytes, by_path):
        rows = table.to_pylist()
        assert word_error_rate(" ".join(SENTENCES[4:6]), rows[0]["text"]) <= 0.2
        assert "left" in rows[1]["text"].lower()
        assert word_error_rate(" ".join(SENTENCES[13:15]), rows[4]["text"]) <= 0.2
        for row in (rows[0], rows[1], rows[4]):
            assert row["error"] is None and row["language"] == "en" and row["duration_s"] > 1
            assert row["segments"] and all(0 <= s["start"] <= s["end"] <= row["duration_s"] for s in row["segments"])
        assert rows[2]["text"] is None and rows[3]["text"] is None and rows[3]["segments"] is None
    assert by_bytes.column("error").to_pylist()[2] == "audio is null"
    assert "not decodable" in by_bytes.column("error").to_pylist()[3]
    assert by_path.column("error").to_pylist()[2] == f"audio file not found: {files[2]}"
    assert by_bytes.column("text").to_pylist() == by_path.column("text").to_pylist()

    from engine import Engine
    from jobs.models import resolve_model
    engine = Engine.from_pretrained(resolve_model("whisper-tiny.en").path, mode="transcribe")
    direct = engine.transcribe([clips[0], clips[4]], language="en")
    assert [by_bytes.column("text").to_pylist()[i] for i in (0, 4)] == [out.text for out in direct]
