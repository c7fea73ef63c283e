"""barge submit --input batch.jsonl: the file is checked as the API checks it, and
--dry-run shows the job it would make without queueing anything."""

import json

import pytest

from cli.main import main
from jobs.spec import JobSpecError

from api.local_batch import check_jsonl, is_openai_input


def write_lines(path, *lines) -> str:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def embed_line(custom_id="a", model="minilm") -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": {"model": model, "input": "x"}}


def test_jsonl_is_openai_by_extension_or_by_flag():
    assert is_openai_input(["batch.jsonl"], None) and is_openai_input(["requests"], "openai")
    assert not is_openai_input(["corpus/*.parquet"], None) and not is_openai_input(["batch.jsonl"], "parquet")


def test_a_bad_file_is_refused_naming_its_lines(tmp_path):
    source = write_lines(tmp_path / "b.jsonl", embed_line("a"), embed_line("a"), embed_line("c", model="nope"))
    with pytest.raises(JobSpecError, match="line 2: duplicate_custom_id.*line 3: model_not_found") as refused:
        check_jsonl(source)
    assert refused.value.field == "input"


def test_a_first_line_nested_too_deep_is_refused_and_u2028_is_text(tmp_path):
    """`barge submit` finds the file's endpoint with the API's JSONL reader (api.json_lines):
    a first line 100,000 deep is the input's error, not a RecursionError."""
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(JobSpecError, match="not a JSON object with a url"):
        check_jsonl(str(deep))
    line = {**embed_line("a"), "body": {"model": "minilm", "input": "one\u2028two"}}
    (tmp_path / "u.jsonl").write_text(json.dumps(line, ensure_ascii=False) + "\r\n")
    assert check_jsonl(str(tmp_path / "u.jsonl")).row_inputs == ["one\u2028two"]


def test_dry_run_shows_the_job_and_queues_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BARGE_DATA_DIR", str(tmp_path / "data"))
    source = write_lines(tmp_path / "b.jsonl", embed_line("a"), embed_line("b"))
    assert main(["submit", "--input", source, "--output", str(tmp_path / "out"), "--dry-run"]) == 0
    assert "2 requests (2 rows) to /v1/embeddings; the job: mode embed, model 'minilm'" in capsys.readouterr().out
    assert not (tmp_path / "out").exists() and not (tmp_path / "data").exists()


def test_dry_run_counts_the_distinct_per_line_params():
    from api.batch_input import CHAT, parse_batch
    from api.local_batch import describe_requests
    lines = [{"custom_id": str(i), "method": "POST", "url": CHAT,
              "body": {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2 + i % 2}}
             for i in range(4)]
    parsed = parse_batch("".join(json.dumps(line) + "\n" for line in lines).encode(), CHAT, {"smollm2": "generate"})
    assert describe_requests(parsed).endswith("params {'params_column': 'params'} (2 distinct sets of per-line params)")


def test_dry_run_of_a_rerank_file_shows_a_score_job_of_one_row_per_document(tmp_path, capsys, monkeypatch):
    # Given a registered one-label sequence classifier (a cross-encoder: config.json alone, no weights read)
    (tmp_path / "reranker").mkdir()
    (tmp_path / "reranker" / "config.json").write_text(json.dumps(
        {"architectures": ["BertForSequenceClassification"], "id2label": {"0": "LABEL_0"}}))
    monkeypatch.setenv("BARGE_MODELS", f"reranker={tmp_path / 'reranker'}")
    monkeypatch.setenv("BARGE_DATA_DIR", str(tmp_path / "data"))
    source = write_lines(tmp_path / "r.jsonl", *[
        {"custom_id": str(i), "method": "POST", "url": "/v1/rerank",
         "body": {"model": "reranker", "query": "q", "documents": ["a", "b", "c"], "top_n": 1}} for i in range(2)])
    # When it is submitted with --dry-run, then the score job is shown and nothing is queued
    assert main(["submit", "--input", source, "--output", str(tmp_path / "out"), "--dry-run"]) == 0
    assert ("2 requests (6 rows) to /v1/rerank; the job: mode score, model 'reranker', params "
            "{'query_column': 'input', 'document_column': 'document'}\n") in capsys.readouterr().out
    assert not (tmp_path / "out").exists() and not (tmp_path / "data").exists()
