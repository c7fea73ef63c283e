"""batch_output for /v1/rerank and /v1/score: a score job's rows (a fabricated results table,
one row per pair) become vLLM's answers, one output line per request."""

import json

from api.batch_output import RequestRows, batch_output
from api.score_input import RERANK, SCORE


def scored(score, num_tokens=4, error=None):
    return {"score": score, "num_tokens": num_tokens, "error": error}


def requests(row_lines, top_ns=None, return_documents=None, documents=None) -> RequestRows:
    num_lines = max(row_lines) + 1
    items = [row_lines[:row].count(line) for row, line in enumerate(row_lines)]
    return RequestRows([f"line-{line}" for line in range(num_lines)], ["float"] * num_lines, row_lines, items,
                       top_ns=top_ns or [None] * num_lines, return_documents=return_documents or [True] * num_lines,
                       row_documents=documents or [f"doc {row}" for row in range(len(row_lines))])


def body_of(output_line: str) -> dict:
    line = json.loads(output_line)
    assert line["response"]["status_code"] == 200 and line["error"] is None
    return line["response"]["body"]


def test_rerank_results_are_best_first_and_index_the_documents_in_input_order():
    made = batch_output(RERANK, "reranker", requests([0, 0, 0, 0]),
                        [scored(0.1), scored(0.9), scored(-2.0), scored(0.5)], "succeeded")
    body = body_of(made.output_lines[0])
    assert set(body) == {"id", "model", "usage", "results"} and body["id"].startswith("rerank-")
    assert body["model"] == "reranker" and body["usage"] == {"prompt_tokens": 16, "total_tokens": 16}
    assert body["results"] == [
        {"index": 1, "relevance_score": 0.9, "document": {"text": "doc 1"}},
        {"index": 3, "relevance_score": 0.5, "document": {"text": "doc 3"}},
        {"index": 0, "relevance_score": 0.1, "document": {"text": "doc 0"}},
        {"index": 2, "relevance_score": -2.0, "document": {"text": "doc 2"}}]
    assert (made.num_completed, made.num_failed, made.input_tokens, made.output_tokens) == (1, 0, 16, 0)


def test_top_n_cuts_each_line_and_return_documents_is_per_line():
    rows = requests([0, 0, 0, 1, 1, 1], top_ns=[2, 5], return_documents=[False, True],
                    documents=["a", "b", "c", "x", "y", "z"])
    made = batch_output(RERANK, "reranker", rows, [scored(s) for s in (0.2, 0.7, 0.5, 0.3, 0.1, 0.6)], "succeeded")
    first, second = (body_of(line) for line in made.output_lines)
    assert first["results"] == [{"index": 1, "relevance_score": 0.7}, {"index": 2, "relevance_score": 0.5}]
    assert [(r["index"], r["document"]["text"]) for r in second["results"]] == [(2, "z"), (0, "x"), (1, "y")]
    assert first["usage"]["total_tokens"] == 12   # every pair scored counts, shown or cut


def test_equal_scores_keep_their_input_order():
    made = batch_output(RERANK, "reranker", requests([0, 0, 0]), [scored(0.5), scored(0.5), scored(0.8)],
                        "succeeded")
    assert [result["index"] for result in body_of(made.output_lines[0])["results"]] == [2, 0, 1]


def test_a_pair_the_engine_could_not_score_is_its_lines_400_naming_the_document():
    made = batch_output(RERANK, "reranker", requests([0, 0, 1, 1]),
                        [scored(0.1), scored(0.2), scored(0.3), scored(None, 0, "pair has 600 tokens; the model takes "
                                                                                "512")], "succeeded")
    assert (made.num_completed, made.num_failed) == (1, 1)
    assert json.loads(made.output_lines[0])["custom_id"] == "line-0"
    failed = json.loads(made.error_lines[0])
    assert failed["custom_id"] == "line-1" and failed["response"]["status_code"] == 400 and failed["error"] is None
    assert failed["response"]["body"]["error"]["message"] == "documents[1]: pair has 600 tokens; the model takes 512"
    assert made.input_tokens == 8   # the output file's requests only


def test_score_data_keeps_the_pair_order_with_vllms_fields():
    made = batch_output(SCORE, "reranker", requests([0, 0, 1]), [scored(0.25, 3), scored(0.75, 5), scored(0.5)],
                        "succeeded")
    first, second = (body_of(line) for line in made.output_lines)
    assert first["id"].startswith("score-") and first["object"] == "list" and first["model"] == "reranker"
    assert isinstance(first["created"], int)
    assert first["data"] == [{"index": 0, "object": "score", "score": 0.25},
                             {"index": 1, "object": "score", "score": 0.75}]
    assert first["usage"] == {"prompt_tokens": 8, "total_tokens": 8, "completion_tokens": 0}
    assert second["data"] == [{"index": 0, "object": "score", "score": 0.5}]


def test_a_failed_score_pair_names_the_pair():
    made = batch_output(SCORE, "reranker", requests([0, 0]), [scored(0.1), scored(None, 0, "text_2 is empty")],
                        "succeeded")
    assert json.loads(made.error_lines[0])["response"]["body"]["error"]["message"] == "pair 1: text_2 is empty"


def test_lines_a_cancelled_score_job_never_ran_are_unrun_errors():
    made = batch_output(RERANK, "reranker", requests([0, 0, 1]), [scored(0.1), scored(0.2), None], "cancelled")
    assert made.num_completed == 1
    assert json.loads(made.error_lines[0])["error"]["code"] == "batch_cancelled"
