"""check_job on real Parquet files: each refusal names the field the user must change."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.spec import JobSpec, JobSpecError
from jobs.validate import check_job, encoded_schema
from storage.manifest import decode_schema

MINILM_DIMENSIONS = 384


@pytest.fixture(autouse=True)
def only_builtin_models(monkeypatch):
    monkeypatch.delenv("BARGE_MODELS", raising=False)
    monkeypatch.delenv("BARGE_MODELS_FILE", raising=False)


@pytest.fixture
def corpus(tmp_path):
    """Two Parquet files of doc_id (int64), text (string), score (float64): 5 + 3 rows."""
    folder = tmp_path / "in"
    folder.mkdir()
    for name, start, num_rows in (("a.parquet", 0, 5), ("b.parquet", 5, 3)):
        ids = list(range(start, start + num_rows))
        pq.write_table(pa.table({"doc_id": pa.array(ids, pa.int64()), "text": [f"row {i}" for i in ids],
                                 "score": [i / 2 for i in ids]}), folder / name, row_group_size=2)
    return folder


def spec(corpus, tmp_path, **changes) -> JobSpec:
    fields = dict(mode="embed", model="minilm", input=str(corpus / "*.parquet"), output=str(tmp_path / "out"))
    return JobSpec(**{**fields, **changes})


def refusal(job: JobSpec) -> JobSpecError:
    with pytest.raises(JobSpecError) as caught:
        check_job(job)
    return caught.value


def test_a_good_job_is_checked(corpus, tmp_path):
    checked = check_job(spec(corpus, tmp_path, id_column="doc_id"))
    assert checked.model.key == "all-MiniLM-L6-v2"
    assert checked.input.num_rows == 8
    assert [f.num_rows for f in checked.input.files] == [5, 3]
    assert checked.output_schema == pa.schema([
        pa.field("doc_id", pa.int64()),
        pa.field("embedding", pa.list_(pa.float32(), MINILM_DIMENSIONS)),
        pa.field("num_tokens", pa.int32()),
        pa.field("error", pa.string()),
    ])
    assert (tmp_path / "out").is_dir()
    assert list((tmp_path / "out").iterdir()) == []   # the writability probe is gone


def test_without_an_id_column_the_output_gets_row_index(corpus, tmp_path):
    schema = check_job(spec(corpus, tmp_path)).output_schema
    assert schema.names == ["row_index", "embedding", "num_tokens", "error"]
    assert schema.field("row_index").type == pa.int64()
    embedding = schema.field("embedding").type
    assert pa.types.is_fixed_size_list(embedding)
    assert embedding.value_type == pa.float32() and embedding.list_size == MINILM_DIMENSIONS


@pytest.mark.parametrize("dimensions, expected", [(None, MINILM_DIMENSIONS), (1, 1), (128, 128),
                                                  (MINILM_DIMENSIONS, MINILM_DIMENSIONS)])
def test_dimensions_set_the_embedding_size(corpus, tmp_path, dimensions, expected):
    checked = check_job(spec(corpus, tmp_path, params={"dimensions": dimensions}))
    assert checked.output_schema.field("embedding").type.list_size == expected


def test_dimensions_larger_than_the_model_are_refused(corpus, tmp_path):
    error = refusal(spec(corpus, tmp_path, params={"dimensions": MINILM_DIMENSIONS + 1}))
    assert error.field == "params.dimensions"
    assert f"larger than the model's {MINILM_DIMENSIONS}" in error.problem


def test_the_encoded_schema_decodes_to_the_output_schema(corpus, tmp_path):
    checked = check_job(spec(corpus, tmp_path))
    assert decode_schema(encoded_schema(checked)) == checked.output_schema


def test_an_unknown_model_is_refused(corpus, tmp_path):
    error = refusal(spec(corpus, tmp_path, model="no-such-model"))
    assert error.field == "model"
    assert not error.problem.startswith("model:")
    assert "no-such-model" in error.problem and "minilm" in error.problem


def test_an_embed_job_with_a_params_column_writes_a_list_as_long_as_each_rows(tmp_path):
    corpus = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": ["a", "b"], "params": ['{"dimensions": 32}', None]}), corpus)
    checked = check_job(spec(tmp_path, tmp_path, input=str(corpus), params={"params_column": "params"}))
    assert checked.output_schema.field("embedding").type == pa.list_(pa.float32())
    incremental = refusal(spec(tmp_path, tmp_path, input=str(corpus), params={"params_column": "params"},
                               incremental=True))
    assert incremental.field == "params.params_column" and "per-row params" in incremental.problem
    assert refusal(spec(tmp_path, tmp_path, input=str(corpus), params={"params_column": "nope"})).field == \
        "params.params_column"


def test_a_registered_model_with_a_small_hidden_size(corpus, tmp_path, monkeypatch):
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"hidden_size": 16}))
    monkeypatch.setenv("BARGE_MODELS", f"tiny={folder}")
    assert check_job(spec(corpus, tmp_path, model="tiny")).output_schema.field("embedding").type.list_size == 16
    assert refusal(spec(corpus, tmp_path, model="tiny", params={"dimensions": 17})).field == "params.dimensions"


def test_a_model_without_hidden_size_needs_dimensions(corpus, tmp_path, monkeypatch):
    folder = tmp_path / "odd"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"d_model": 16}))
    monkeypatch.setenv("BARGE_MODELS", f"odd={folder}")
    error = refusal(spec(corpus, tmp_path, model="odd"))
    assert error.field == "params.dimensions"
    assert "hidden_size" in error.problem
    checked = check_job(spec(corpus, tmp_path, model="odd", params={"dimensions": 8}))
    assert checked.output_schema.field("embedding").type.list_size == 8


def test_a_missing_input_column_is_refused_naming_it(corpus, tmp_path):
    error = refusal(spec(corpus, tmp_path, input_column="body"))
    assert error.field == "input_column"
    assert "'body'" in error.problem


def test_a_non_string_input_column_is_refused(corpus, tmp_path):
    error = refusal(spec(corpus, tmp_path, input_column="score"))
    assert error.field == "input_column"
    assert "'score'" in error.problem and "string" in error.problem


def test_a_missing_id_column_is_refused_naming_it(corpus, tmp_path):
    error = refusal(spec(corpus, tmp_path, id_column="uuid"))
    assert error.field == "id_column"
    assert "'uuid'" in error.problem


def test_an_id_column_that_clashes_with_an_output_column_is_refused(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    pq.write_table(pa.table({"embedding": [1, 2], "text": ["a", "b"]}), folder / "a.parquet")
    error = refusal(spec(folder, tmp_path, id_column="embedding"))
    assert error.field == "id_column"
    assert "clashes" in error.problem


def test_a_non_parquet_file_is_refused(tmp_path):
    bad = tmp_path / "notes.parquet"
    bad.write_text("this is not parquet")
    error = refusal(spec(tmp_path, tmp_path, input=str(bad)))
    assert error.field == "input"
    assert "not a Parquet file" in error.problem


def test_a_glob_matching_nothing_is_refused(corpus, tmp_path):
    error = refusal(spec(corpus, tmp_path, input=str(corpus / "*.nothing")))
    assert error.field == "input"


def test_a_missing_file_is_refused(corpus, tmp_path):
    error = refusal(spec(corpus, tmp_path, input=[str(corpus / "a.parquet"), str(corpus / "gone.parquet")]))
    assert error.field == "input"
    assert "gone.parquet" in error.problem


def test_an_output_under_a_regular_file_is_refused(corpus, tmp_path):
    (tmp_path / "file").write_text("x")
    error = refusal(spec(corpus, tmp_path, output=str(tmp_path / "file" / "out")))
    assert error.field == "output"
    assert "not writable" in error.problem


@pytest.fixture
def committed_output(tmp_path):
    output = tmp_path / "out"
    output.mkdir()
    (output / "_SUCCESS").write_text("")
    return output


def test_a_committed_output_is_refused_by_default(corpus, tmp_path, committed_output):
    error = refusal(spec(corpus, tmp_path, output=str(committed_output)))
    assert error.field == "output"
    assert "already holds a committed result" in error.problem and "if_exists='replace'" in error.problem


def test_a_committed_output_is_accepted_with_replace(corpus, tmp_path, committed_output):
    checked = check_job(spec(corpus, tmp_path, output=str(committed_output), if_exists="replace"))
    assert checked.input.num_rows == 8
    assert (committed_output / "_SUCCESS").exists()   # checking never touches the old result


def test_an_uncommitted_output_with_old_files_is_accepted(corpus, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "part-00000-00000.parquet").write_bytes(b"half written")
    assert check_job(spec(corpus, tmp_path)).input.num_rows == 8


def test_a_prompt_name_the_model_lacks_is_refused(corpus, tmp_path, monkeypatch):
    folder = tmp_path / "qwen3-embedding"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 512, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 512}))
    (folder / "modules.json").write_text("[]")
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {"query": "Instruct: x\nQuery:"}}))
    monkeypatch.setenv("BARGE_MODELS", f"qwen3-embedding={folder}")
    assert check_job(spec(corpus, tmp_path, model="qwen3-embedding", params={"prompt_name": "query"}))
    assert check_job(spec(corpus, tmp_path, model="qwen3-embedding", params={"prompt": "Represent: "}))
    error = refusal(spec(corpus, tmp_path, model="qwen3-embedding", params={"prompt_name": "passage"}))
    assert error.field == "params.prompt_name" and "known: query" in error.problem


def test_an_fp8_job_with_a_check_is_accepted(corpus, tmp_path):
    checked = check_job(spec(corpus, tmp_path, quantization="fp8", quant_check_rows=64))
    assert checked.model.key == "all-MiniLM-L6-v2"


def test_a_check_on_a_checkpoint_that_is_fp8_already_is_refused(corpus, tmp_path, monkeypatch):
    folder = tmp_path / "fp8-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"hidden_size": 16, "quantization_config": {"quant_method": "fp8"}}))
    monkeypatch.setenv("BARGE_MODELS", f"fp8-model={folder}")
    error = refusal(spec(corpus, tmp_path, model="fp8-model", quantization="fp8", quant_check_rows=8))
    assert error.field == "quant_check_rows" and "FP8 checkpoint already" in error.problem
    assert check_job(spec(corpus, tmp_path, model="fp8-model", quantization="fp8")).model.path == str(folder)


def test_a_transcribe_job_may_ask_for_beam_search_within_limits(corpus, tmp_path):
    """`text` holds strings, which a transcribe job reads as audio paths or URLs."""
    job = dict(mode="transcribe", model="whisper-tiny.en", input_column="text")
    assert check_job(spec(corpus, tmp_path, **job, params={"beam_size": 5}))
    error = refusal(spec(corpus, tmp_path, **job, params={"beam_size": 17}))
    assert error.field == "params.beam_size" and "beam_size must be an integer from 1 (greedy) to 16" in error.problem


@pytest.mark.parametrize("params, field, problem", [
    ({"language": "xx"}, "params.language", "'xx'"),
    ({"language": "English"}, "params.language", "language code"),
    ({"long_form": "chunks"}, "params.long_form", "long_form must be one of"),
])
def test_a_bad_transcribe_param_is_refused_naming_it(corpus, tmp_path, params, field, problem):
    job = dict(mode="transcribe", model="whisper-tiny.en", input_column="text")
    error = refusal(spec(corpus, tmp_path, **job, params=params))
    assert error.field == field and problem in error.problem


def test_a_transcribe_job_may_ask_for_words_detection_and_sequential_windows(corpus, tmp_path):
    job = dict(mode="transcribe", model="whisper-tiny.en", input_column="text")
    assert check_job(spec(corpus, tmp_path, **job, params={"word_timestamps": True, "language": None,
                                                           "long_form": "sequential"}))
    with pytest.raises(JobSpecError, match="params.word_timestamps: must be a boolean"):
        spec(corpus, tmp_path, **job, params={"word_timestamps": "yes"})


@pytest.mark.parametrize("params, field, problem", [
    ({"structured": {"regex": "[a-"}}, "params.structured", "structured.regex does not compile"),
    ({"max_tokens": 0}, "params.max_tokens", "max_tokens must be an int >= 1"),
])
def test_a_bad_generate_param_is_refused_at_submit_naming_it(corpus, tmp_path, params, field, problem):
    refused = refusal(spec(corpus, tmp_path, mode="generate", model="smollm2", params=params))
    assert refused.field == field and problem in refused.problem


def test_a_generate_job_may_ask_for_any_whitespace_and_jump_forward(corpus, tmp_path):
    check_job(spec(corpus, tmp_path, mode="generate", model="smollm2",
                   params={"structured": {"json_object": True}, "structured_whitespace": "any", "jump_forward": True}))
