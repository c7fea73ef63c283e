"""batch_output: one output line per input line, in the output or the error file."""

import base64
import json

import numpy as np

from api.batch_output import MAX_LINE_REASON_CHARS, RequestRows, batch_output, job_errors


def generated(text="Paris.", error=None):
    return {"text": text, "finish_reason": "stop", "num_prompt_tokens": 5, "num_output_tokens": 2, "error": error}


def requests(custom_ids, row_lines, encodings=None):
    items = [row_lines[:i].count(line) for i, line in enumerate(row_lines)]
    return RequestRows(custom_ids, encodings or ["float"] * len(custom_ids), row_lines, items)


def test_a_succeeded_chat_line_is_a_200_with_the_chat_completion_and_usage():
    made = batch_output("/v1/chat/completions", "smollm2", requests(["a"], [0]), [generated()], "succeeded")
    line = json.loads(made.output_lines[0])
    assert (made.num_completed, made.num_failed, made.error_lines) == (1, 0, [])
    assert line["custom_id"] == "a" and line["id"].startswith("batch_req_") and line["error"] is None
    body = line["response"]["body"]
    assert line["response"]["status_code"] == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Paris.", "refusal": None}
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert (made.input_tokens, made.output_tokens) == (5, 2)


def test_a_row_error_is_the_endpoints_400_in_the_error_file():
    made = batch_output("/v1/completions", "smollm2", requests(["a", "b"], [0, 1]),
                        [generated(), generated(None, "prompt has 9000 tokens")], "succeeded")
    line = json.loads(made.error_lines[0])
    assert (made.num_completed, made.num_failed) == (1, 1) and line["custom_id"] == "b"
    assert (made.input_tokens, made.output_tokens) == (5, 2)   # the output file's requests only
    assert line["response"]["status_code"] == 400
    assert line["response"]["body"]["error"]["message"] == "prompt has 9000 tokens"


def test_lines_an_ended_job_never_ran_carry_its_reason():
    made = batch_output("/v1/chat/completions", "smollm2", requests(["a", "b", "c"], [0, 1, 2]),
                        [generated(), None, None], "expired")
    codes = [json.loads(line)["error"]["code"] for line in made.error_lines]
    assert codes == ["batch_expired", "batch_expired"] and made.num_completed == 1
    assert [json.loads(line)["response"] for line in made.error_lines] == [None, None]


def test_lines_a_failed_job_never_ran_say_why_cut_short_and_the_batch_errors_hold_it_whole():
    reason = "planning failed: cannot read /data/batch_1/requests.parquet: " + "x" * 1000
    made = batch_output("/v1/chat/completions", "smollm2", requests(["a", "b"], [0, 1]), [generated(), None],
                        "failed", reason)
    (error,) = [json.loads(line)["error"] for line in made.error_lines]
    assert error["code"] == "batch_failed" and made.num_completed == 1
    assert error["message"].startswith("This request was not executed: the batch failed: planning failed: cannot "
                                       "read /data/batch_1/requests.parquet: xxx")
    assert error["message"].endswith("…") and len(error["message"]) < MAX_LINE_REASON_CHARS + 60
    assert job_errors(reason) == [{"code": "batch_failed", "message": reason, "param": None, "line": None}]
    # No reason recorded: the bare sentence on the lines, still an error on the batch.
    bare = batch_output("/v1/completions", "smollm2", requests(["a"], [0]), [None], "failed")
    assert json.loads(bare.error_lines[0])["error"]["message"] == "This request was not executed: the batch failed."
    assert job_errors(None)[0]["code"] == "batch_failed" and job_errors(None)[0]["message"]


def test_a_line_with_several_inputs_is_complete_only_with_all_of_them():
    rows = [{"embedding": [1.0, 0.0], "num_tokens": 3, "error": None}, None]
    made = batch_output("/v1/embeddings", "minilm", requests(["a"], [0, 0]), rows, "cancelled")
    assert made.num_failed == 1 and json.loads(made.error_lines[0])["error"]["code"] == "batch_cancelled"


def test_embeddings_in_float_and_base64():
    vector = [0.25, -0.5, 0.1]
    rows = [{"embedding": vector, "num_tokens": 3, "error": None}] * 2
    made = batch_output("/v1/embeddings", "minilm", requests(["f", "b"], [0, 1], ["float", "base64"]), rows,
                        "succeeded")
    as_float, as_base64 = (json.loads(line)["response"]["body"] for line in made.output_lines)
    assert as_float["data"][0]["embedding"] == np.asarray(vector, np.float32).tolist()
    decoded = np.frombuffer(base64.b64decode(as_base64["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, np.asarray(vector, np.float32))
    assert as_float["usage"] == {"prompt_tokens": 3, "total_tokens": 3}


def test_each_line_keeps_its_own_width_in_float_and_base64():
    """Lines asking different dimensions: the job's list column holds each row's length."""
    rows = [{"embedding": [0.6, 0.8], "num_tokens": 2, "error": None},
            {"embedding": [1.0, 0.0, 0.0, 0.0], "num_tokens": 4, "error": None},
            {"embedding": [0.0, 1.0, 0.0, 0.0], "num_tokens": 5, "error": None}]
    made = batch_output("/v1/embeddings", "minilm", requests(["two", "four"], [0, 1, 1], ["float", "base64"]), rows,
                        "succeeded")
    two, four = (json.loads(line)["response"]["body"] for line in made.output_lines)
    assert len(two["data"][0]["embedding"]) == 2
    decoded = [np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4") for item in four["data"]]
    assert [len(vector) for vector in decoded] == [4, 4] and four["usage"]["prompt_tokens"] == 9


LOGPROBS = [  # the job's logprobs column for "Par" + "\xe9" split over two tokens: bytes, not text, are whole
    {"token_id": 7, "token": b"Par", "logprob": -0.25,
     "top_logprobs": [{"token_id": 7, "token": b"Par", "logprob": -0.25}, {"token_id": 9, "token": b"Lo", "logprob": -2.0}]},
    {"token_id": 3, "token": b"\xc3", "logprob": -0.5,
     "top_logprobs": [{"token_id": 3, "token": b"\xc3", "logprob": -0.5}, {"token_id": 4, "token": b"is", "logprob": -1.5}]},
]


def test_logprobs_are_shaped_as_openais_chat_and_completion_types():
    from openai.types import Completion
    from openai.types.chat import ChatCompletion
    chat = batch_output("/v1/chat/completions", "smollm2", requests(["a"], [0]),
                        [{**generated(), "logprobs": LOGPROBS}], "succeeded")
    logprobs = ChatCompletion.model_validate(json.loads(chat.output_lines[0])["response"]["body"]).choices[0].logprobs
    assert [(t.token, t.logprob, t.bytes) for t in logprobs.content] == [("Par", -0.25, list(b"Par")),
                                                                          ("\ufffd", -0.5, [0xC3])]
    assert [(t.token, t.logprob) for t in logprobs.content[0].top_logprobs] == [("Par", -0.25), ("Lo", -2.0)]
    completion = batch_output("/v1/completions", "smollm2", requests(["b"], [0]),
                              [{**generated(), "logprobs": LOGPROBS}], "succeeded")
    body = Completion.model_validate(json.loads(completion.output_lines[0])["response"]["body"])
    assert body.choices[0].logprobs.tokens == ["Par", "\ufffd"]
    assert body.choices[0].logprobs.token_logprobs == [-0.25, -0.5] and body.choices[0].logprobs.text_offset == [0, 3]
    assert body.choices[0].logprobs.top_logprobs[1] == {"\ufffd": -0.5, "is": -1.5}
    plain = batch_output("/v1/chat/completions", "smollm2", requests(["c"], [0]), [generated()], "succeeded")
    assert json.loads(plain.output_lines[0])["response"]["body"]["choices"][0]["logprobs"] is None
