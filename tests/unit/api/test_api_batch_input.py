"""parse_batch: a batch file becomes rows with each line's params, or OpenAI's line errors."""

import json

import pytest

from api.batch_input import (CHAT, COMPLETIONS, DEFAULT_MAX_TOKENS, EMBEDDINGS, BatchRequests, completion_window_s,
                             parse_batch)

MODELS = {"smollm2": "generate", "qwen3": "generate", "minilm": "embed"}


def line(custom_id="a", url=CHAT, **body) -> dict:
    body = body or {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}]}
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def jsonl(*lines) -> bytes:
    return "".join((text if isinstance(text, str) else json.dumps(text)) + "\n" for text in lines).encode()


def row_params(batch) -> list[dict]:
    return batch.row_params


def errors_of(data: bytes, endpoint=CHAT) -> list[tuple]:
    result = parse_batch(data, endpoint, MODELS)
    assert isinstance(result, list), result
    return [(error.line, error.code, error.param) for error in result]


def test_chat_lines_become_message_rows_with_openai_defaults():
    batch = parse_batch(jsonl(line("a"), line("b", model="smollm2", messages=[
        {"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
        {"role": "user", "content": "Hi"}])), CHAT, MODELS)
    assert batch.custom_ids == ["a", "b"] and batch.model == "smollm2"
    assert batch.params == {"params_column": "params"}
    assert row_params(batch) == [{"max_tokens": DEFAULT_MAX_TOKENS, "temperature": 1.0, "top_p": 1.0}] * 2
    assert batch.row_inputs[1] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def test_sampling_fields_map_to_engine_params():
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 5,
            "temperature": 0, "top_p": 0.5, "seed": 7, "stop": "\n"}
    assert row_params(parse_batch(jsonl(line(**body)), CHAT, MODELS)) == [{
        "max_tokens": 5, "temperature": 0, "top_p": 0.5, "seed": 7, "stop": ["\n"]}]


def test_lines_may_differ_in_sampling_params_and_response_format():
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    messages = [{"role": "user", "content": "Hi"}]
    batch = parse_batch(jsonl(
        line("a", model="smollm2", messages=messages, max_tokens=3, temperature=0),
        line("b", model="smollm2", messages=messages, seed=5, stop=["."],
             response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema, "strict": True}}),
        line("c", model="smollm2", messages=messages, response_format={"type": "json_object"}),
        line("d", model="smollm2", messages=messages, response_format={"type": "text"})), CHAT, MODELS)
    assert batch.params == {"params_column": "params"}
    defaults = {"max_tokens": DEFAULT_MAX_TOKENS, "temperature": 1.0, "top_p": 1.0}
    assert row_params(batch) == [
        {"max_tokens": 3, "temperature": 0, "top_p": 1.0},
        {**defaults, "seed": 5, "stop": ["."], "structured": {"json_schema": schema}},
        {**defaults, "structured": {"json_object": True}},
        defaults]


def test_logprobs_asked_by_one_line_give_the_job_a_logprobs_column_and_each_row_its_own():
    messages = [{"role": "user", "content": "Hi"}]
    batch = parse_batch(jsonl(line("a", model="smollm2", messages=messages, logprobs=True, top_logprobs=3),
                              line("b", model="smollm2", messages=messages),
                              line("c", model="smollm2", messages=messages, logprobs=True)), CHAT, MODELS)
    assert batch.params == {"params_column": "params", "logprobs": 0}
    assert [params["logprobs"] for params in row_params(batch)] == [3, None, 0]
    completions = parse_batch(jsonl(line("d", COMPLETIONS, model="smollm2", prompt="x", logprobs=5)), COMPLETIONS,
                              MODELS)
    assert row_params(completions)[0]["logprobs"] == 5
    assert parse_batch(jsonl(line("e")), CHAT, MODELS).params == {"params_column": "params"}


def test_a_list_prompt_gives_each_of_its_rows_the_lines_params():
    batch = parse_batch(jsonl(line("a", COMPLETIONS, model="smollm2", prompt=["x", "y"], max_tokens=2),
                              line("b", COMPLETIONS, model="smollm2", prompt="z", max_tokens=9)), COMPLETIONS, MODELS)
    assert [params["max_tokens"] for params in row_params(batch)] == [2, 2, 9]


def test_a_list_input_is_one_row_per_item_of_one_line():
    batch = parse_batch(jsonl(line("e", EMBEDDINGS, model="minilm", input=["x", "y"], encoding_format="base64")),
                        EMBEDDINGS, MODELS)
    assert (batch.row_lines, batch.row_items, batch.row_inputs, batch.encodings) == ([0, 0], [0, 1], ["x", "y"],
                                                                                     ["base64"])


@pytest.mark.parametrize("text, expected", [
    ("{oops", (1, "invalid_json_line", None)),
    ("[1, 2]", (1, "invalid_json_line", None)),
    (json.dumps({"method": "POST", "url": CHAT, "body": {}}), (1, "missing_required_parameter", "custom_id")),
    (json.dumps({**line(), "url": "/v1/embeddings"}), (1, "mismatched_endpoint", "url")),
    (json.dumps({**line(), "method": "GET"}), (1, "invalid_value", "method")),
    (json.dumps(line(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}])),
     (1, "model_not_found", "body.model")),
    (json.dumps(line(model="minilm", messages=[{"role": "user", "content": "Hi"}])),
     (1, "model_not_found", "body.model")),
    (json.dumps(line(model="smollm2", messages=[{"role": "user", "content": "Hi"}], tools=[])),
     (1, "unsupported_parameter", "body.tools")),
    (json.dumps(line(model="smollm2", messages=[{"role": "user", "content": "Hi"}], top_logprobs=2)),
     (1, "invalid_value", "body.top_logprobs")),
    (json.dumps(line(model="smollm2", messages=[{"role": "user", "content": "Hi"}], logprobs=True,
                     top_logprobs=21)), (1, "invalid_value", "body.top_logprobs")),
    (json.dumps(line(model="smollm2", messages=[{"role": "user", "content": "Hi"}], logprobs=3)),
     (1, "invalid_value", "body.logprobs")),
    (json.dumps(line(model="smollm2", messages=[{"role": "user", "content": "Hi"}], n=2)), (1, "invalid_value", "body.n")),
    (json.dumps(line(model="smollm2", messages=[{"role": "tool", "content": "Hi"}])),
     (1, "invalid_value", "body.messages[0]")),
    (json.dumps(line(model="smollm2", messages=[], temperature=0)), (1, "missing_required_parameter", "body.messages")),
    (json.dumps(line(model="smollm2", messages=[{"role": "user", "content": "Hi"}], temperature=3)),
     (1, "invalid_value", "body.temperature")),
    (json.dumps(line(model="smollm2", messages=[{"role": "user", "content": "Hi"}],
                     response_format={"type": "xml"})), (1, "invalid_value", "body.response_format")),
    (json.dumps(line(model="smollm2", messages=[{"role": "user", "content": "Hi"}],
                     response_format={"type": "json_schema", "json_schema": {"name": "x"}})),
     (1, "invalid_value", "body.response_format")),
])
def test_a_bad_line_is_named_with_openais_code(text, expected):
    assert errors_of(jsonl(text)) == [expected]


def test_every_bad_line_is_reported_with_its_number():
    data = jsonl(line("a"), "{", line("a"), line("b", model="smollm2", messages=[{"role": "user", "content": "x"}],
                                                  temperature=-1))
    assert errors_of(data) == [(2, "invalid_json_line", None), (3, "duplicate_custom_id", "custom_id"),
                               (4, "invalid_value", "body.temperature")]


def test_embedding_lines_take_their_own_dimensions_as_row_params():
    batch = parse_batch(jsonl(line("a", EMBEDDINGS, model="minilm", input=["x", "y"], dimensions=8),
                              line("b", EMBEDDINGS, model="minilm", input="z"),
                              line("c", EMBEDDINGS, model="minilm", input="w", dimensions=384)),
                        EMBEDDINGS, MODELS, {"minilm": 384})
    assert batch.params == {"params_column": "params"}
    assert row_params(batch) == [{"dimensions": 8}, {"dimensions": 8}, {}, {"dimensions": 384}]


@pytest.mark.parametrize("dimensions", [385, 0, -1, 2.5, True, "64"])
def test_a_dimensions_the_model_cannot_give_is_its_lines_error(dimensions):
    data = jsonl(line("a", EMBEDDINGS, model="minilm", input="x", dimensions=32),
                 line("b", EMBEDDINGS, model="minilm", input="y", dimensions=dimensions),
                 line("c", EMBEDDINGS, model="minilm", input="z", dimensions=128))
    result = parse_batch(data, EMBEDDINGS, MODELS, {"minilm": 384})
    assert [(error.line, error.code, error.param) for error in result] == [(2, "invalid_value", "body.dimensions")]
    assert result[0].message.startswith("dimensions must be an integer from 1 to 384, the model's width, got ")


def test_without_the_models_width_only_a_positive_integer_is_checked_here():
    """A model whose config names no width: the engine refuses a too-wide row as it runs."""
    assert isinstance(parse_batch(jsonl(line("a", EMBEDDINGS, model="minilm", input="x", dimensions=4096)),
                                  EMBEDDINGS, MODELS), BatchRequests)
    assert errors_of(jsonl(line("a", EMBEDDINGS, model="minilm", input="x", dimensions=0)), EMBEDDINGS) == [
        (1, "invalid_value", "body.dimensions")]


def test_lines_must_share_one_model():
    data = jsonl(line("a", COMPLETIONS, model="smollm2", prompt="x"), line("b", COMPLETIONS, model="qwen3", prompt="y"))
    assert errors_of(data, COMPLETIONS) == [(2, "mismatched_model", "body.model")]


def test_a_file_that_is_not_utf8_or_empty_is_refused_whole():
    assert errors_of(b"\xff\xfe") == [(None, "invalid_file", None)]
    assert errors_of(b"\n\n") == [(None, "empty_file", None)]


@pytest.mark.parametrize("window, seconds", [("24h", 86_400), ("30m", 1800), ("20s", 20), ("25h", None),
                                             ("0s", None), ("1d", None), ("h", None), (24, None)])
def test_completion_window(window, seconds):
    assert completion_window_s(window) == seconds
