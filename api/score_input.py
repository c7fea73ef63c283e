"""The (query, document) pairs of one /v1/rerank or /v1/score line, as vLLM's endpoints
take them, checked before anything is queued.

    /v1/rerank  {model, query, documents: [str, ...], top_n?, return_documents?}
                one pair per document: (query, documents[i])
    /v1/score   {model, text_1: str | [str], text_2: str | [str]}
                1 -> 1, 1 -> N (text_1 paired with each of text_2), or N -> N (zipped)

Each pair is one row of the batch's score job; what the output needs per line besides the
scores (top_n, return_documents) rides along in `ScorePairs`. A query must be a non-empty
string; a document may be empty (a cross-encoder scores it), as vLLM takes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from api.json_lines import json_type, shown

RERANK = "/v1/rerank"
SCORE = "/v1/score"

# Documents one rerank line (or text_2 entries one score line) may hold: Cohere's limit,
# and a line's results are one response body, held whole.
MAX_PAIRS_PER_REQUEST = 1_000


@dataclass(frozen=True)
class ScorePairs:
    queries: list[str]          # pair -> its query (text_1), in the line's order
    documents: list[str]        # pair -> its document (text_2); pair i is result index i
    top_n: int | None = None    # rerank: answer the best this many (None: every document)
    return_documents: bool = False  # rerank: each result carries {"document": {"text": ...}}


class BadPairs(ValueError):
    """A line refused, with the code and the body param its LineError names."""

    def __init__(self, code: str, message: str, param: str):
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param


def score_pairs(body: dict, endpoint: str) -> ScorePairs:
    """The line's pairs; BadPairs naming the first thing wrong."""
    if endpoint == RERANK:
        return _rerank_pairs(body)
    if endpoint == SCORE:
        return _text_pairs(body)
    raise ValueError(f"{endpoint!r} scores no pairs")


def _rerank_pairs(body: dict) -> ScorePairs:
    query = _query(body.get("query"), "query")
    documents = _documents(body.get("documents"), "documents")
    top_n = body.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0):
        raise BadPairs("invalid_value", f"top_n must be an integer >= 0 (0 or left out: every document), "
                                        f"got {shown(top_n)}", "body.top_n")
    top_n = top_n or None   # 0 means every document, as vLLM's /v1/rerank reads it
    return_documents = body.get("return_documents", True)   # vLLM's results always carry theirs
    if not isinstance(return_documents, bool):
        raise BadPairs("invalid_value", f"return_documents must be a boolean, got {shown(return_documents)}",
                       "body.return_documents")
    return ScorePairs([query] * len(documents), documents, top_n, return_documents)


def _text_pairs(body: dict) -> ScorePairs:
    """vLLM's pairing: one text_1 goes with every text_2; else the two lists zip, equal in length."""
    firsts = _text_list(body.get("text_1"), "text_1")
    empty = next((index for index, text in enumerate(firsts) if not text), None)
    if empty is not None:   # a query, never empty
        param = "body.text_1" if isinstance(body["text_1"], str) else f"body.text_1[{empty}]"
        raise BadPairs("invalid_value", "text_1 must be a non-empty string or a list of them", param)
    seconds = _text_list(body.get("text_2"), "text_2")
    if len(firsts) == 1:
        firsts = firsts * len(seconds)
    elif len(firsts) != len(seconds):
        raise BadPairs("invalid_value", f"text_1 has {len(firsts)} texts and text_2 {len(seconds)}; give one text_1, "
                                        "or as many as text_2", "body.text_2")
    return ScorePairs(firsts, seconds)


def _text_list(value: object, name: str) -> list[str]:
    """A string or a list of them, as a list."""
    return _documents([value] if isinstance(value, str) else value, name)


def _query(value: object, name: str) -> str:
    if value is None:
        raise BadPairs("missing_required_parameter", f"the body has no {name}", f"body.{name}")
    if not isinstance(value, str) or not value:
        raise BadPairs("invalid_value", f"{name} must be a non-empty string, not {_kind(value)}", f"body.{name}")
    return value


def _documents(value: object, name: str) -> list[str]:
    if value is None:
        raise BadPairs("missing_required_parameter", f"the body has no {name}", f"body.{name}")
    if not isinstance(value, list):
        raise BadPairs("invalid_value", f"{name} must be a list of strings, not {json_type(value)}", f"body.{name}")
    if not value:
        raise BadPairs("invalid_value", f"{name} is empty; give at least one", f"body.{name}")
    if len(value) > MAX_PAIRS_PER_REQUEST:
        raise BadPairs("invalid_value", f"{name} has {len(value)} entries; a request takes at most "
                                        f"{MAX_PAIRS_PER_REQUEST}", f"body.{name}")
    for index, text in enumerate(value):
        if not isinstance(text, str):   # {"text": ...} objects and token ids are not taken
            raise BadPairs("invalid_value", f"{name} must hold strings; entry {index} is {json_type(text)}",
                           f"body.{name}[{index}]")
    return value


def _kind(value: object) -> str:
    return "an empty string" if value == "" else json_type(value)
