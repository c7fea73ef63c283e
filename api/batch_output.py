"""A finished job's rows as OpenAI's batch output and error files.

Each input line gets exactly one output line, in input order: in the output file when
all of its rows succeeded ({"id", "custom_id", "response": {"status_code": 200,
"request_id", "body"}, "error": null}, the body shaped as the synchronous endpoint
answers, usage included), else in the error file: a row the engine refused (too long,
empty; a pair it could not score, named) as the endpoint's 400 answer, a line the job
never ran (cancelled, expired, failed) with `error` {code, message} and no response. A
failed job's reason (its error, redacted by the caller) is the batch's `errors` whole
(`job_errors`) and, cut short, the message of every line it left unrun: a reader of
either file sees why, not only `barge status`.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from dataclasses import dataclass, field

import numpy as np

from api.batch_input import CHAT, COMPLETIONS, EMBEDDINGS, SCORE_ENDPOINTS
from api.score_input import RERANK

# Why a line has no result when its job ended before reaching it.
UNFINISHED = {
    "expired": ("batch_expired", "This request could not be executed before the completion window expired."),
    "cancelled": ("batch_cancelled", "This request was not executed: the batch was cancelled."),
    "failed": ("batch_failed", "This request was not executed: the batch failed."),
}
# A failed job's reason as each unrun line of the error file carries it: one reason
# repeated on up to 50,000 lines, so cut; the batch's `errors` hold it whole.
MAX_LINE_REASON_CHARS = 300


@dataclass(frozen=True)
class RequestRows:
    """The batch's requests as stored for its job (api.batch_store), line by line."""

    custom_ids: list[str]              # line -> custom_id
    encodings: list[str]               # line -> "float" | "base64"
    row_lines: list[int]               # row (the job's row_index) -> line
    row_items: list[int]               # row -> position in its line's input list
    top_ns: list[int | None] = field(default_factory=list)       # line -> rerank's top_n (None: all results)
    return_documents: list[bool] = field(default_factory=list)   # line -> rerank's results carry their document
    row_documents: list[str] = field(default_factory=list)       # row -> its pair's document (rerank, score)
    line_models: list[str] = field(default_factory=list)   # line -> `model` as it named it, where lines name
                                                           # adapters (BASE:ADAPTER); empty: the batch's model


@dataclass(frozen=True)
class BatchOutput:
    output_lines: list[str]            # JSONL lines of the output file
    error_lines: list[str]             # JSONL lines of the error file
    num_completed: int
    num_failed: int
    input_tokens: int = 0              # over the requests in the output file
    output_tokens: int = 0


def batch_output(endpoint: str, model: str, requests: RequestRows, results: list[dict | None],
                 ended: str, reason: str | None = None) -> BatchOutput:
    """`model`: the batch's, which each body names (a line that named an adapter: its own,
    requests.line_models); `results`: row -> the job's output row as a dict (None: not run);
    `ended`: the job's final state ("succeeded", "expired", "cancelled", "failed");
    `reason`: a failed job's error, redacted, which each line it left unrun carries (cut short)."""
    rows_of_line: list[list[int]] = [[] for _ in requests.custom_ids]
    for row, line in enumerate(requests.row_lines):
        rows_of_line[line].append(row)
    output, errors = [], []
    input_tokens = output_tokens = 0
    for line, rows in enumerate(rows_of_line):
        line_results = [results[row] for row in rows]
        custom_id = requests.custom_ids[line]
        if any(result is None for result in line_results):
            errors.append(_line(custom_id, None, unrun_error(ended, reason)))
        elif any(result["error"] for result in line_results):
            failed = next(item for item, result in enumerate(line_results) if result["error"])
            message = _row_error(endpoint, failed, line_results[failed]["error"])
            errors.append(_line(custom_id, _response(400, {"error": _error_body(message)}), None))
        else:
            line_model = requests.line_models[line] if requests.line_models else model
            body = (_score_body(endpoint, model, line_results, requests, line, rows) if endpoint in SCORE_ENDPOINTS
                    else _body(endpoint, line_model, line_results, requests.encodings[line]))
            output.append(_line(custom_id, _response(200, body), None))
            input_tokens += body["usage"]["prompt_tokens"]
            output_tokens += body["usage"].get("completion_tokens", 0)
    return BatchOutput(output, errors, num_completed=len(output), num_failed=len(errors), input_tokens=input_tokens,
                       output_tokens=output_tokens)


def unrun_error(ended: str, reason: str | None) -> dict:
    """The `error` of a line its job never ran: why, by the job's final state, and a
    failed job's reason cut to MAX_LINE_REASON_CHARS."""
    code, message = UNFINISHED.get(ended, UNFINISHED["failed"])
    if code == "batch_failed" and reason:
        cut = reason if len(reason) <= MAX_LINE_REASON_CHARS else reason[:MAX_LINE_REASON_CHARS - 1] + "…"
        message = f"This request was not executed: the batch failed: {cut}"
    return {"code": code, "message": message}


def job_errors(reason: str | None) -> list[dict]:
    """A failed job's batch `errors` (OpenAI BatchError objects): its reason, whole."""
    message = reason or "The batch's job failed without a recorded reason."
    return [{"code": "batch_failed", "message": message, "param": None, "line": None}]


def _line(custom_id: str, response: dict | None, error: dict | None) -> str:
    return json.dumps({"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id, "response": response,
                       "error": error}, ensure_ascii=False)


def _response(status_code: int, body: dict) -> dict:
    return {"status_code": status_code, "request_id": uuid.uuid4().hex, "body": body}


def _error_body(message: str) -> dict:
    return {"message": message, "type": "invalid_request_error", "param": None, "code": None}


def _row_error(endpoint: str, item: int, error: str) -> str:
    """A line fails with its first failed row; a rerank or score line says which pair (its result index)."""
    if endpoint == RERANK:
        return f"documents[{item}]: {error}"
    return f"pair {item}: {error}" if endpoint in SCORE_ENDPOINTS else error


def _score_body(endpoint: str, model: str, results: list[dict], requests: RequestRows, line: int,
                rows: list[int]) -> dict:
    """vLLM's /v1/rerank and /v1/score answers; `results` are the line's pairs in input order,
    so result i is documents[i] (rerank) or pair i (score)."""
    num_tokens = sum(result["num_tokens"] for result in results)
    if endpoint == RERANK:
        # best first; equal scores keep their input order (sorted is stable)
        ranked = sorted(range(len(results)), key=lambda index: -results[index]["score"])[:requests.top_ns[line]]
        with_documents = requests.return_documents[line]
        return {"id": f"rerank-{uuid.uuid4().hex}", "model": model,
                "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
                "results": [{"index": index, "relevance_score": results[index]["score"],
                             **({"document": {"text": requests.row_documents[rows[index]]}} if with_documents else {})}
                            for index in ranked]}
    return {"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()), "model": model,
            "data": [{"index": index, "object": "score", "score": result["score"]}
                     for index, result in enumerate(results)],
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens, "completion_tokens": 0}}


def _body(endpoint: str, model: str, results: list[dict], encoding: str) -> dict:
    if endpoint == EMBEDDINGS:
        return _embeddings_body(model, results, encoding)
    prompt_tokens = sum(result["num_prompt_tokens"] for result in results)
    completion_tokens = sum(result["num_output_tokens"] for result in results)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "total_tokens": prompt_tokens + completion_tokens}
    created = int(time.time())
    if endpoint == CHAT:
        result = results[0]
        choice = {"index": 0, "message": {"role": "assistant", "content": result["text"], "refusal": None},
                  "logprobs": _chat_logprobs(result.get("logprobs")), "finish_reason": result["finish_reason"]}
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": created,
                "model": model, "choices": [choice], "usage": usage, "system_fingerprint": None}
    if endpoint == COMPLETIONS:
        choices = [{"index": index, "text": result["text"], "logprobs": _completion_logprobs(result.get("logprobs")),
                    "finish_reason": result["finish_reason"]} for index, result in enumerate(results)]
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": created, "model": model,
                "choices": choices, "usage": usage, "system_fingerprint": None}
    raise ValueError(f"no output shape for endpoint {endpoint!r}")


def _token_text(token: bytes) -> str:
    # A token may be part of a UTF-8 character: its text then holds U+FFFD, its `bytes` the truth.
    return token.decode("utf-8", errors="replace")


def _chat_logprobs(tokens: list[dict] | None) -> dict | None:
    """The job's logprobs column (storage.schemas) as chat's choices[].logprobs."""
    if tokens is None:
        return None

    def entry(token: dict) -> dict:
        return {"token": _token_text(token["token"]), "logprob": token["logprob"], "bytes": list(token["token"])}

    return {"content": [{**entry(token), "top_logprobs": [entry(top) for top in token["top_logprobs"]]}
                        for token in tokens], "refusal": None}


def _completion_logprobs(tokens: list[dict] | None) -> dict | None:
    """The same as /v1/completions answers it: parallel lists, text offsets in characters."""
    if tokens is None:
        return None
    texts = [_token_text(token["token"]) for token in tokens]
    offsets = [sum(len(text) for text in texts[:index]) for index in range(len(texts))]
    return {"tokens": texts, "token_logprobs": [token["logprob"] for token in tokens],
            "top_logprobs": [{_token_text(top["token"]): top["logprob"] for top in token["top_logprobs"]}
                             for token in tokens], "text_offset": offsets}


def _embeddings_body(model: str, results: list[dict], encoding: str) -> dict:
    data = [{"object": "embedding", "index": index, "embedding": _encoded(result["embedding"], encoding)}
            for index, result in enumerate(results)]
    num_tokens = sum(result["num_tokens"] for result in results)
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}}


def _encoded(embedding, encoding: str):
    values = np.asarray(embedding, dtype=np.float32)
    if encoding == "base64":   # little-endian float32, as OpenAI's (numpy.frombuffer(..., "float32") reads it)
        return base64.b64encode(values.astype("<f4").tobytes()).decode("ascii")
    return values.tolist()
