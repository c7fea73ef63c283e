"""Classify and score jobs at submit: their params (the spec's table, the checks across
them, the engine's param objects), the modes a model serves, and check_job on real
Parquet files and config-only model folders (no weights are read at submit)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.score.params import ClassifyParams, ScoreParams
from jobs.models import model_mode, model_modes
from jobs.scoring import as_pairs, classify_params, job_param_field, score_params
from jobs.spec import JobSpec, JobSpecError
from jobs.validate import check_job, read_columns

PAIR_TYPE = pa.list_(pa.string())


@pytest.fixture(autouse=True)
def only_builtin_models(monkeypatch):
    monkeypatch.delenv("BARGE_MODELS", raising=False)
    monkeypatch.delenv("BARGE_MODELS_FILE", raising=False)


def config_folder(parent, name: str, architecture: str, model_type: str = "bert", num_labels: int | None = None,
                  **extra) -> str:
    folder = parent / name
    folder.mkdir()
    config = {"architectures": [architecture], "model_type": model_type, "hidden_size": 8, **extra}
    if num_labels is not None:
        config["id2label"] = {str(i): ["negative", "neutral", "positive"][i] if num_labels == 3 else f"LABEL_{i}"
                              for i in range(num_labels)}
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.fixture
def models(tmp_path):
    return {"classifier": config_folder(tmp_path, "classifier", "BertForSequenceClassification", num_labels=3),
            "cross-encoder": config_folder(tmp_path, "cross-encoder", "BertForSequenceClassification", num_labels=1),
            "causal-lm": config_folder(tmp_path, "causal-lm", "LlamaForCausalLM", "llama"),
            "bi-encoder": "minilm"}


@pytest.fixture
def pairs_file(tmp_path):
    """pair_id, q, d (text), pair ([q, d]), qid (int), n (int), chat (messages), nested (list of ints)."""
    messages = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    table = pa.table({
        "pair_id": pa.array([0, 1, 2], pa.int64()),
        "q": ["what is a barge", "what is a barge", "licence"],
        "d": ["a flat boat", None, "MIT"],
        "pair": pa.array([["what is a barge", "a flat boat"], ["q", "d"], ["licence", "MIT"]], PAIR_TYPE),
        "qid": pa.array([7, 7, 8], pa.int64()),
        "chat": pa.array([[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]] * 3,
                         messages),
        "nested": pa.array([[1], [2], [3]], pa.list_(pa.int64())),
    })
    path = tmp_path / "pairs.parquet"
    pq.write_table(table, path)
    return str(path)


def score_job(pairs_file, tmp_path, model, **params) -> JobSpec:
    return JobSpec(mode="score", model=model, input=pairs_file, output=str(tmp_path / "out"), id_column="pair_id",
                   input_column="pair", params=params)


def refusal(job_or_call) -> JobSpecError:
    with pytest.raises(JobSpecError) as caught:
        check_job(job_or_call()) if callable(job_or_call) else check_job(job_or_call)
    return caught.value


# -- the spec: params table and the checks across params ------------------------------------------------------

@pytest.mark.parametrize("mode, params, field", [
    ("classify", {"top_n": 3}, "params.top_n"),                               # a score param
    ("classify", {"all_scores": "yes"}, "params.all_scores"),
    ("classify", {"threshold": True}, "params.threshold"),
    ("score", {"all_scores": True}, "params.all_scores"),                     # a classify param
    ("score", {"query_column": "q"}, "params.query_column"),                  # without document_column
    ("score", {"document_column": "d"}, "params.document_column"),
    ("score", {"query_column": "q", "document_column": "d", "chat": True}, "params.chat"),
    ("score", {"top_n": 3}, "params.top_n"),                                  # without group_column
    ("score", {"group_column": "qid"}, "params.group_column"),                # without top_n
    ("score", {"group_column": "qid", "top_n": 0}, "params.top_n"),
    ("score", {"group_column": " ", "top_n": 2}, "params.group_column"),
    ("score", {"top_n": 2.5, "group_column": "qid"}, "params.top_n"),
])
def test_params_that_do_not_fit_are_refused_naming_the_field(mode, params, field):
    with pytest.raises(JobSpecError) as refused:
        JobSpec(mode=mode, model="m", input="in.parquet", output="out/", params=params)
    assert refused.value.field == field


@pytest.mark.parametrize("mode, params", [
    ("classify", {"all_scores": True, "threshold": 0.3, "activation": "sigmoid", "truncate": False}),
    ("score", {"query_column": "q", "document_column": "d", "group_column": "qid", "top_n": 10}),
    ("score", {"chat": True, "group_column": "prompt_id", "top_n": 1}),
    ("score", {"instruction": "Find the licence", "yes_token": "yes", "no_token": "no", "group_by_query": False}),
])
def test_well_formed_params_pass_the_spec(mode, params):
    assert JobSpec(mode=mode, model="m", input="in.parquet", output="out/", params=params).params == params


@pytest.mark.parametrize("mode", ["classify", "score"])
def test_quantization_is_refused_for_classify_and_score_with_the_reason(mode):
    with pytest.raises(JobSpecError) as refused:
        JobSpec(mode=mode, model="m", input="in.parquet", output="out/", quantization="fp8")
    assert refused.value.field == "quantization"
    assert f"{mode} jobs run the model's own weights" in str(refused.value)


# -- the engine's param objects ---------------------------------------------------------------------------------

def test_job_params_become_the_engines_param_objects():
    assert classify_params({"all_scores": True, "threshold": 0.2}) == ClassifyParams(return_all_scores=True,
                                                                                     threshold=0.2)
    assert score_params({"query_column": "q", "document_column": "d", "group_column": "g", "top_n": 3, "chat": False,
                         "instruction": "x"}) == ScoreParams(instruction="x")


@pytest.mark.parametrize("mode, message, field", [
    ("classify", "threshold must be a number in [0, 1], got 2", "params.threshold"),
    ("classify", "return_all_scores must be a bool, got 1", "params.all_scores"),
    ("score", "yes_token and no_token must differ, both are 'y'", "params.yes_token"),
    ("score", "activation must be one of ('auto', 'sigmoid', 'none'), got 'softmax'", "params.activation"),
    ("score", "[0, 1] is not a name", "params"),
])
def test_an_engine_refusal_names_the_job_param(mode, message, field):
    assert job_param_field(message, mode) == field


def test_one_column_of_pairs_becomes_tuples_and_what_is_not_a_pair_an_error():
    pairs, errors = as_pairs([["q", "d"], None, ["q"], ["q", None]])
    assert pairs == [("q", "d"), None, None, ("q", None)]       # a null document: the engine's to name
    assert errors == {1: "pair is null", 2: "pair has 1 texts, not 2 ([query, document])"}


# -- the modes a model serves -----------------------------------------------------------------------------------

def test_the_modes_a_model_serves_come_from_its_config(tmp_path, models):
    assert model_modes(models["classifier"]) == ("classify",)
    assert model_mode(models["cross-encoder"]) == "score"           # one label: a cross-encoder or reward model
    assert model_modes(models["cross-encoder"]) == ("score", "classify")
    assert model_modes(models["causal-lm"]) == ("generate", "score")
    assert model_modes(config_folder(tmp_path, "bert", "BertModel")) == ("embed", "score")
    whisper = config_folder(tmp_path, "whisper", "WhisperForConditionalGeneration", "whisper")
    assert model_modes(whisper) == ("transcribe",)


# -- check_job ----------------------------------------------------------------------------------------------------

def test_a_classify_job_is_checked_against_the_models_head(tmp_path, pairs_file, models):
    job = JobSpec(mode="classify", model=models["classifier"], input=pairs_file, output=str(tmp_path / "out"),
                  input_column="q", id_column="pair_id", params={"all_scores": True})
    assert check_job(job).output_schema.names == ["pair_id", "label", "score", "labels", "scores", "num_tokens",
                                                  "error"]
    embed_model = refusal(JobSpec(mode="classify", model="minilm", input=pairs_file, output=str(tmp_path / "o2"),
                                  input_column="q"))
    assert embed_model.field == "model" and "cannot classify: BertModel is not a sequence classifier" in str(embed_model)
    bad = refusal(JobSpec(mode="classify", model=models["classifier"], input=pairs_file, output=str(tmp_path / "o3"),
                          input_column="q", params={"threshold": 1.5}))
    assert bad.field == "params.threshold"


def test_a_classify_job_takes_texts_pairs_and_chats_but_an_embed_job_no_pairs(tmp_path, pairs_file, models):
    for index, column in enumerate(("q", "pair", "chat")):
        check_job(JobSpec(mode="classify", model=models["classifier"], input=pairs_file,
                          output=str(tmp_path / f"out{index}"), input_column=column))
    refused = refusal(JobSpec(mode="embed", model="minilm", input=pairs_file, output=str(tmp_path / "e"),
                              input_column="pair"))
    assert refused.field == "input_column" and "only classify and score jobs take pairs" in str(refused)


def test_a_score_job_reads_two_columns_and_carries_its_group_column(tmp_path, pairs_file, models):
    job = score_job(pairs_file, tmp_path, models["cross-encoder"], query_column="q", document_column="d",
                    group_column="qid", top_n=1)
    checked = check_job(job)
    assert checked.output_schema == pa.schema([("pair_id", pa.int64()), ("qid", pa.int64()), ("score", pa.float64()),
                                               ("num_tokens", pa.int32()), ("error", pa.string())])
    assert read_columns(job) == ["q", "d", "pair_id", "qid"]


def test_a_score_rows_work_is_both_texts(tmp_path, pairs_file, models):
    """Planning sizes shards by tokens: a pair costs its query's and its document's."""
    both = check_job(score_job(pairs_file, tmp_path, models["cross-encoder"], query_column="q", document_column="d"))
    query_only = check_job(JobSpec(mode="classify", model=models["classifier"], input=pairs_file,
                                   output=str(tmp_path / "c"), input_column="q"))
    document_only = check_job(JobSpec(mode="classify", model=models["classifier"], input=pairs_file,
                                      output=str(tmp_path / "d"), input_column="d"))
    assert both.input.total_work == query_only.input.total_work + document_only.input.total_work
    one_column = check_job(score_job(pairs_file, tmp_path / "x", models["cross-encoder"]))   # input_column: pair
    assert one_column.input.total_work > 0


@pytest.mark.parametrize("model, input_column, params, field, words", [
    ("classifier", "q", {"query_column": "q", "document_column": "d"}, "model", "classifier of 3 labels"),
    ("bi-encoder", "chat", {"chat": True}, "params.chat", "needs a reward model"),
    ("causal-lm", "chat", {"chat": True}, "params.chat", "is a yes-no"),
    ("cross-encoder", "q", {"query_column": "q", "document_column": "d", "instruction": "x"}, "params.instruction",
     "applies to a yes-no"),
    ("causal-lm", "q", {"query_column": "q", "document_column": "d", "activation": "none"}, "params.activation",
     "applies to a cross-encoder"),
    ("cross-encoder", "q", {"query_column": "qid", "document_column": "d"}, "params.query_column", "must hold text"),
    ("cross-encoder", "q", {"query_column": "q", "document_column": "missing"}, "params.document_column",
     "not in the file"),
    ("cross-encoder", "q", {}, "input_column", "reads [query, document] lists"),
    ("cross-encoder", "pair", {"chat": True}, "input_column", "chat messages"),
    ("cross-encoder", "q", {"query_column": "q", "document_column": "d", "group_column": "nested", "top_n": 1},
     "params.group_column", "a group is a plain value"),
    ("cross-encoder", "q", {"query_column": "q", "document_column": "d", "group_column": "qid", "top_n": 1,
                            "yes_token": "y", "no_token": "y"}, "params.yes_token", "must differ"),
])
def test_a_score_job_that_does_not_fit_its_model_or_input_is_refused(tmp_path, pairs_file, models, model,
                                                                       input_column, params, field, words):
    refused = refusal(JobSpec(mode="score", model=models[model], input=pairs_file, output=str(tmp_path / "out"),
                              input_column=input_column, params=params))
    assert refused.field == field, refused
    assert words in str(refused)


def test_a_score_job_of_each_kind_passes(tmp_path, pairs_file, models):
    check_job(score_job(pairs_file, tmp_path / "a", models["cross-encoder"]))                 # pair: the input column
    check_job(score_job(pairs_file, tmp_path / "b", models["causal-lm"], query_column="q", document_column="d",
                        instruction="Find the answer"))
    check_job(score_job(pairs_file, tmp_path / "c", models["bi-encoder"], query_column="q", document_column="d"))
    chat = JobSpec(mode="score", model=models["cross-encoder"], input=pairs_file, output=str(tmp_path / "d"),
                   input_column="chat", params={"chat": True})
    assert check_job(chat).output_schema.names == ["row_index", "score", "num_tokens", "error"]


# -- the results cache --------------------------------------------------------------------------------------------

def test_a_score_rows_cache_key_holds_both_texts_and_its_namespace_no_top_n():
    from jobs.cache_keys import cache_namespace, row_key
    assert row_key(("q", "d1")) != row_key(("q", "d2")) != row_key(("q2", "d2"))
    assert row_key(("q", "d")) == row_key(["q", "d"])     # two columns or one column of pairs: one result

    def namespace(mode="score", **params):
        return cache_namespace(JobSpec(mode=mode, model="m", input="in.parquet", output="out/", params=params), "rev")

    columns = {"query_column": "q", "document_column": "d"}
    assert namespace(**columns, group_column="qid", top_n=3) == namespace(query_column="a", document_column="b")
    assert namespace(**columns, instruction="x") != namespace(**columns)
    assert namespace("classify", all_scores=True) != namespace("classify")
