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

OUTPUT_COLUMNS = ["doc_id", "text", "segments", "language", "language_probability", "duration_s", "error"]
WORD_TYPE = pa.struct([("word", pa.string()), ("start", pa.float64()), ("end", pa.float64()),
                       ("probability", pa.float64())])


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
        with pytest.raises(JobSpecError, match="params.language") as refused:
            client.submit(JobSpec(mode="transcribe", model="whisper-tiny.en", input=str(tmp_path / "bytes"),
                                  input_column="audio", output=str(tmp_path / "bad"), params={"language": "xx"}))
        assert refused.value.field == "params.language" and "'xx'" in str(refused.value)
        with pytest.raises(JobSpecError, match="input_column"):
            client.submit(JobSpec(mode="transcribe", model="whisper-tiny.en", input=str(tmp_path / "bytes"),
                                  input_column="doc_id", output=str(tmp_path / "bad")))
        jobs = [client.submit(JobSpec(mode="transcribe", model="whisper-tiny.en", input=str(tmp_path / kind),
                                      input_column="audio", id_column="doc_id", output=str(tmp_path / f"out-{kind}"),
                                      params={"language": "en", "vad": True}, max_rows_per_shard=3))
                for kind in ("bytes", "paths")]
        jobs.append(client.submit(JobSpec(mode="transcribe", model="whisper-tiny.en", input=str(tmp_path / "bytes"),
                                          input_column="audio", id_column="doc_id", output=str(tmp_path / "out-words"),
                                          params={"language": "en", "vad": False, "word_timestamps": True},
                                          max_rows_per_shard=3)))
        for job in jobs:
            state = job.wait(timeout=300)
            assert state.status == JobStatus.SUCCEEDED, deployment.worker_logs()
            assert (state.rows_total, state.rows_succeeded, state.rows_failed) == (5, 3, 2)

    by_bytes, by_path, with_words = (job.results().sort_by("doc_id") for job in jobs)
    assert by_bytes.schema.names == by_path.schema.names == with_words.schema.names == OUTPUT_COLUMNS
    assert by_bytes.schema.field("segments").type == pa.list_(
        pa.struct([("start", pa.float64()), ("end", pa.float64()), ("text", pa.string()),
                   ("words", pa.list_(WORD_TYPE))]))
    assert all(s["words"] is None for segments in by_bytes.column("segments").to_pylist() if segments
               for s in segments)
    assert by_bytes.column("language_probability").to_pylist() == [None] * 5   # given, not detected
    for table in (by_bytes, by_path):
        rows = table.to_pylist()
        assert word_error_rate(" ".join(SENTENCES[4:6]), rows[0]["text"]) <= 0.2
        assert "left" in rows[1]["text"].lower()
        # tiny.en mishears this mp3 ("for a merrily morning", "My drummer"): openai-whisper's
        # transcribe on the same weights says the same words, WER 0.25
        assert word_error_rate(" ".join(SENTENCES[13:15]), rows[4]["text"]) <= 0.3
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
    _check_words(with_words.to_pylist(), clips, engine)


def _check_words(rows: list[dict], clips: list, engine) -> None:
    """The word_timestamps job's words: every ok row's equal the engine's own, and on the
    ALSA clip (one window) openai-whisper's transcribe(word_timestamps=True) on the same
    weights, within 0.02 s."""
    import whisper
    from engine.whisper.audio import load_audio
    from tests.support.whisper_models import openai_reference, tiny_en_path
    direct = engine.transcribe([clips[i] for i in (0, 1, 4)], language="en", vad=False, word_timestamps=True)
    for row, out in zip((rows[0], rows[1], rows[4]), direct):
        assert row["error"] is None and row["text"] == out.text
        words = [w for s in row["segments"] for w in s["words"]]
        assert words and words == [{"word": w.word, "start": w.start, "end": w.end, "probability": w.probability}
                                   for s in out.segments for w in s.words]
        assert all(0 <= w["start"] <= w["end"] <= row["duration_s"] for w in words)
        assert [w["start"] for w in words] == sorted(w["start"] for w in words)
    reference = openai_reference(tiny_en_path())
    reference.set_alignment_heads(whisper._ALIGNMENT_HEADS["tiny.en"])
    audio = load_audio(clips[1])
    theirs = whisper.transcribe(reference, audio.samples(0, audio.num_samples), language="en",
                                word_timestamps=True, fp16=False)
    expected = [w for s in theirs["segments"] for w in s["words"]]
    ours = [w for s in rows[1]["segments"] for w in s["words"]]
    assert [w["word"] for w in ours] == [w["word"] for w in expected] and len(ours) == 2
    for mine, reference_word in zip(ours, expected):
        assert abs(mine["start"] - reference_word["start"]) <= 0.02 and abs(mine["end"] - reference_word["end"]) <= 0.02
