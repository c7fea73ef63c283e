"""parse_batch for /v1/rerank and /v1/score: each line's (query, document) pairs become rows
of one score job, or the line is refused naming its line and param."""

import json

import pyarrow.parquet as pq
import pytest

from api import batch_input
from api.batch_input import CHAT, EMBEDDINGS, PAIR_COLUMN_PARAMS, BatchRequests, parse_batch
from api.batch_store import read_requests, write_requests
from api.score_input import MAX_PAIRS_PER_REQUEST, RERANK, SCORE

MODELS = {"reranker": "score", "minilm": "embed", "smollm2": "generate"}


def line(custom_id="a", url=RERANK, **body) -> dict:
    if not body:
        body = ({"model": "reranker", "query": "q", "documents": ["d0", "d1"]} if url == RERANK
                else {"model": "reranker", "text_1": "q", "text_2": ["d0", "d1"]})
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def rerank(**fields) -> dict:
    return {"model": "reranker", "query": "q", "documents": ["d0", "d1"], **fields}


def jsonl(*lines) -> bytes:
    return "".join(json.dumps(text) + "\n" for text in lines).encode()


def parsed(*lines, endpoint=RERANK) -> BatchRequests:
    batch = parse_batch(jsonl(*lines), endpoint, MODELS)
    assert isinstance(batch, BatchRequests), batch
    return batch


def errors_of(*lines, endpoint=RERANK) -> list[tuple]:
    result = parse_batch(jsonl(*lines), endpoint, MODELS)
    assert isinstance(result, list), result
    return [(error.line, error.code, error.param) for error in result]


def test_a_rerank_line_is_one_row_per_document_with_its_query():
    batch = parsed(line("a"), line("b", **rerank(query="p", documents=["x", "", "z"], top_n=2, return_documents=False)))
    assert batch.params == PAIR_COLUMN_PARAMS == {"query_column": "input", "document_column": "document"}
    assert batch.row_lines == [0, 0, 1, 1, 1] and batch.row_items == [0, 1, 0, 1, 2]
    assert batch.row_inputs == ["q", "q", "p", "p", "p"]
    assert batch.row_documents == ["d0", "d1", "x", "", "z"]   # an empty document is scored, as vLLM does
    assert batch.top_ns == [None, 2] and batch.return_documents == [True, False]
    assert batch.row_params == [{}] * 5


@pytest.mark.parametrize(("text_1", "text_2", "pairs"), [
    ("q", "d", [("q", "d")]),                                          # 1 -> 1
    ("q", ["d0", "d1"], [("q", "d0"), ("q", "d1")]),                   # 1 -> N
    (["q"], ["d0", "d1"], [("q", "d0"), ("q", "d1")]),                 # a list of one is one
    (["q0", "q1"], ["d0", "d1"], [("q0", "d0"), ("q1", "d1")]),        # N -> N, zipped
])
def test_score_lines_pair_their_texts_as_vllm(text_1, text_2, pairs):
    batch = parsed(line("a", SCORE, model="reranker", text_1=text_1, text_2=text_2), endpoint=SCORE)
    assert list(zip(batch.row_inputs, batch.row_documents)) == pairs
    assert batch.row_items == list(range(len(pairs))) and batch.params == PAIR_COLUMN_PARAMS


@pytest.mark.parametrize(("body", "expected"), [
    ({"model": "reranker", "documents": ["d"]}, ("missing_required_parameter", "body.query")),
    (rerank(query=""), ("invalid_value", "body.query")),
    (rerank(query=["q"]), ("invalid_value", "body.query")),
    ({"model": "reranker", "query": "q"}, ("missing_required_parameter", "body.documents")),
    (rerank(documents="d"), ("invalid_value", "body.documents")),
    (rerank(documents=[]), ("invalid_value", "body.documents")),
    (rerank(documents=["d", 3]), ("invalid_value", "body.documents[1]")),
    (rerank(documents=[{"text": "d"}]), ("invalid_value", "body.documents[0]")),
    (rerank(documents=["d"] * (MAX_PAIRS_PER_REQUEST + 1)), ("invalid_value", "body.documents")),
    (rerank(top_n=-1), ("invalid_value", "body.top_n")),
    (rerank(top_n=1.5), ("invalid_value", "body.top_n")),
    (rerank(top_n=True), ("invalid_value", "body.top_n")),
    (rerank(return_documents="yes"), ("invalid_value", "body.return_documents")),
    (rerank(truncate_prompt_tokens=8), ("unsupported_parameter", "body.truncate_prompt_tokens")),
    (rerank(model="minilm"), ("model_not_found", "body.model")),       # an embed model, not a scorer
    (rerank(model="nope"), ("model_not_found", "body.model")),
    ({"query": "q", "documents": ["d"]}, ("missing_required_parameter", "body.model")),
], ids=lambda value: str(value)[:60])
def test_a_bad_rerank_line_is_refused_on_its_line_naming_the_param(body, expected):
    assert errors_of(line("good"), line("bad", **body), line("last")) == [(2, *expected)]


@pytest.mark.parametrize(("body", "expected"), [
    ({"model": "reranker", "text_2": "d"}, ("missing_required_parameter", "body.text_1")),
    ({"model": "reranker", "text_1": "q"}, ("missing_required_parameter", "body.text_2")),
    ({"model": "reranker", "text_1": "", "text_2": "d"}, ("invalid_value", "body.text_1")),
    ({"model": "reranker", "text_1": ["q", ""], "text_2": ["d", "e"]}, ("invalid_value", "body.text_1[1]")),
    ({"model": "reranker", "text_1": [], "text_2": "d"}, ("invalid_value", "body.text_1")),
    ({"model": "reranker", "text_1": "q", "text_2": 7}, ("invalid_value", "body.text_2")),
    ({"model": "reranker", "text_1": "q", "text_2": ["d", None]}, ("invalid_value", "body.text_2[1]")),
    ({"model": "reranker", "text_1": ["q0", "q1"], "text_2": ["d0", "d1", "d2"]}, ("invalid_value", "body.text_2")),
    ({"model": "reranker", "text_1": ["q0", "q1"], "text_2": "d"}, ("invalid_value", "body.text_2")),
    ({"model": "reranker", "text_1": "q", "text_2": "d", "top_n": 1}, ("unsupported_parameter", "body.top_n")),
    ({"model": "smollm2", "text_1": "q", "text_2": "d"}, ("model_not_found", "body.model")),
], ids=lambda value: str(value)[:60])
def test_a_bad_score_line_is_refused_on_its_line_naming_the_param(body, expected):
    good = line("good", SCORE)
    assert errors_of(good, line("bad", SCORE, **body), line("last", SCORE), endpoint=SCORE) == [(2, *expected)]


def test_every_bad_line_is_named_and_the_good_ones_are_not():
    assert errors_of(line("a"), line("b", url=SCORE), line("a"), line("c", **rerank(top_n=-1)), line("d")) == [
        (2, "mismatched_endpoint", "url"), (3, "duplicate_custom_id", "custom_id"), (4, "invalid_value", "body.top_n")]


def test_lines_must_share_one_model():
    assert errors_of(line("a"), line("b", **rerank(model="other")), endpoint=RERANK) == [
        (2, "model_not_found", "body.model")]
    two = {**MODELS, "other": "score"}
    result = parse_batch(jsonl(line("a"), line("b", **rerank(model="other"))), RERANK, two)
    assert [(error.line, error.code, error.param) for error in result] == [(2, "mismatched_model", "body.model")]


def test_too_many_pairs_over_the_batch_fail_it_whole(monkeypatch):
    monkeypatch.setattr(batch_input, "MAX_SCORE_PAIRS", 3)
    assert errors_of(line("a"), line("b")) == [(None, "too_many_inputs", None)]
    assert isinstance(parse_batch(jsonl(line("a"), line("b", **rerank(documents=["d"]))), RERANK, MODELS),
                      BatchRequests)


def test_the_existing_endpoints_keep_their_params_and_take_no_pairs():
    chat = parsed(line("a", CHAT, model="smollm2", messages=[{"role": "user", "content": "Hi"}]), endpoint=CHAT)
    embed = parsed(line("b", EMBEDDINGS, model="minilm", input=["x", "y"]), endpoint=EMBEDDINGS)
    assert chat.params == embed.params == {"params_column": "params"}
    assert chat.row_documents == embed.row_documents == []
    assert errors_of(line("c", EMBEDDINGS, model="reranker", input="x"), endpoint=EMBEDDINGS) == [
        (1, "model_not_found", "body.model")]


def test_a_rerank_batch_is_stored_as_the_score_jobs_input_and_read_back(tmp_path):
    batch = parsed(line("a"), line("b", **rerank(documents=["x", "y", "z"], top_n=1, return_documents=False)))
    url = write_requests(str(tmp_path), batch)
    table = pq.read_table(url)
    assert table.column("input").to_pylist() == ["q", "q", "q", "q", "q"]
    assert table.column("document").to_pylist() == ["d0", "d1", "x", "y", "z"]
    requests = read_requests(str(tmp_path))
    assert requests.custom_ids == ["a", "b"] and requests.row_lines == [0, 0, 1, 1, 1]
    assert requests.top_ns == [None, 1] and requests.return_documents == [True, False]
    assert requests.row_documents == ["d0", "d1", "x", "y", "z"]


def test_an_embeddings_batch_is_stored_and_read_back_without_pair_columns(tmp_path):
    batch = parsed(line("a", EMBEDDINGS, model="minilm", input="x"), endpoint=EMBEDDINGS)
    assert "document" not in pq.read_table(write_requests(str(tmp_path), batch)).column_names
    requests = read_requests(str(tmp_path))
    assert requests.custom_ids == ["a"] and requests.row_documents == [] and requests.top_ns == []


def test_a_model_is_taken_for_any_mode_it_serves():
    # Given served models as served_models() gives them: every mode, the first its own (jobs.models.model_modes)
    served = {"minilm": ("embed", "score"), "smollm2": ("generate", "score"), "reranker": ("score", "classify"),
              "sentiment": ("classify",)}
    # Then an embedder (cosine) and a decoder (yes/no) rerank, and a many-label classifier does not
    for model in ("minilm", "smollm2", "reranker"):
        assert isinstance(parse_batch(jsonl(line("a", **rerank(model=model))), RERANK, served), BatchRequests)
    (refused,) = parse_batch(jsonl(line("a", **rerank(model="sentiment"))), RERANK, served)
    assert (refused.code, refused.param) == ("model_not_found", "body.model")
    assert refused.message == "the model 'sentiment' is a model for classify, not for /v1/rerank"
    embed = line("b", EMBEDDINGS, model="minilm", input="x")
    assert isinstance(parse_batch(jsonl(embed), EMBEDDINGS, served), BatchRequests)
    (refused,) = parse_batch(jsonl({**embed, "body": {"model": "reranker", "input": "x"}}), EMBEDDINGS, served)
    assert refused.message == "the model 'reranker' is a model for score and classify, not for /v1/embeddings"


def test_a_rerank_top_n_of_zero_answers_every_document_as_vllm():
    assert parsed(line("a", **rerank(top_n=0))).top_ns == [None]
