"""parse_batch reads its file as JSONL should (api.json_lines), over a generated corpus of
malformed lines (tests/support/bad_jsonl.py): each bad line is one error with its code and
its physical line number, the good lines beside it are none, accepted lines keep their
text exactly, and nothing raises."""

import json
import random

import pyarrow.parquet as pq
import pytest

from api.batch_input import CHAT, EMBEDDINGS, BatchRequests, parse_batch
from api.batch_store import write_requests
from api.json_lines import MAX_DEPTH, physical_lines
from tests.support.bad_jsonl import MODELS, Case, corpus, encoded, file_of, request

CASES = corpus()
MAX_MESSAGE_CHARS = 300   # whatever a line holds: 1 MB values are echoed cut short


def errors_of(data: bytes, endpoint: str) -> list[tuple]:
    result = parse_batch(data, endpoint, MODELS)
    assert isinstance(result, list), "the file was accepted"
    assert all(len(error.message) <= MAX_MESSAGE_CHARS for error in result), [e.message[:400] for e in result]
    return [(error.line, error.code, error.param) for error in result]


def contents(batch: BatchRequests) -> list[str]:
    return [messages[0]["content"] for messages in batch.row_inputs]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_case_between_two_good_lines_is_named_on_its_own_line(case: Case):
    # Given a good request, the case, a good request
    built = file_of([case])
    # When the file is parsed, then only the case's line (2) is named, or the file is accepted
    if case.code is None:
        batch = parse_batch(built.data, case.endpoint, MODELS)
        assert isinstance(batch, BatchRequests), batch
        assert batch.num_lines == 3 and contents(batch)[1] == case.content
    else:
        assert errors_of(built.data, case.endpoint) == [(2, case.code, case.param)]


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n"], ids=["lf", "crlf"])
@pytest.mark.parametrize("endpoint", [CHAT, EMBEDDINGS])
def test_a_file_of_every_case_names_each_bad_line_by_its_physical_number(line_end, endpoint):
    built = file_of([case for case in CASES if case.endpoint == endpoint], line_end, bom=True)
    assert errors_of(built.data, endpoint) == built.errors


def test_accepted_lines_keep_their_exact_text_through_the_requests_parquet(tmp_path):
    # Given every accepted case in a CRLF file that starts with a BOM
    accepted = [case for case in CASES if case.code is None]
    built = file_of(accepted, b"\r\n", bom=True)
    batch = parse_batch(built.data, CHAT, MODELS)
    assert isinstance(batch, BatchRequests), batch
    # Then each keeps its text (no "\r", no BOM), in the batch and in its job's input
    assert contents(batch)[1::2] == [case.content for case in accepted]
    assert batch.custom_ids[0] == "good-0" and batch.custom_ids[-1] == "good-last"
    table = pq.read_table(write_requests(str(tmp_path), batch))
    assert [messages[0]["content"] for messages in table.column("input").to_pylist()] == contents(batch)


def test_the_depth_limit_cases_sit_on_either_side_of_it():
    def depth(value) -> int:
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        return 1 + max(map(depth, children), default=0) if isinstance(value, (dict, list)) else 0

    by_name = {case.name: case for case in CASES}
    assert depth(json.loads(by_name["schema-at-depth-limit"].line)) == MAX_DEPTH
    assert depth(json.loads(by_name["schema-over-depth-limit"].line)) == MAX_DEPTH + 1


def test_lines_end_only_at_newline_and_count_blank_ones():
    text = "\ufeff{}\r\n\n \t\r\n{\"a\": \"\u2028\x85\"}\r\n\x0c\n{}"
    assert list(physical_lines(text)) == [(1, "{}"), (4, "{\"a\": \"\u2028\x85\"}"), (5, "\x0c"), (6, "{}")]


def test_a_bom_is_dropped_only_at_the_start_of_the_file():
    good = [encoded(request(custom_id)) for custom_id in "abc"]
    assert isinstance(parse_batch("\ufeff".encode() + b"\n".join(good), CHAT, MODELS), BatchRequests)
    assert errors_of("\ufeff\ufeff".encode() + b"\n".join(good), CHAT) == [(1, "invalid_json_line", None)]
    assert errors_of(b"\xef\xbb\xbf\n\xef\xbb\xbf", CHAT) == [(2, "invalid_json_line", None)]


# Pieces a mutation splices into a good line: structure, the values this corpus is about,
# and characters str.splitlines or a lax parser treats specially.
MUTATIONS = ["[" * 70, "{\"a\":" * 70, "]", "}", "\"", "\\", ",", ":", "\\ud800", "\\udc00", "\\u0000", "\x00",
             "\x0c", "\x1e", "\x85", "\u2028", "\r", "\ufeff", "NaN", "-Infinity", "1e999", "9" * 5000, "null",
             "true", "[]", "{}", "\"x\"", "\t", "\U0001F600"]


def test_randomly_mutated_lines_are_named_by_their_line_or_accepted_and_never_raise():
    rng = random.Random(40)
    good = [encoded(request(f"r{i}", f"row {i}", temperature=0.5, stop=["\n"])).decode() for i in range(4)]
    for _ in range(400):
        lines = list(good)
        victim = rng.randrange(len(lines))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(lines[victim]) + 1)
            lines[victim] = lines[victim][:at] + rng.choice(MUTATIONS) + lines[victim][at + rng.randint(0, 3):]
        data = "\n".join(lines).encode()
        result = parse_batch(data, CHAT, MODELS)
        if isinstance(result, list):   # a "\r" mid-line is only a character; the victim's line stays where it was
            assert {error.line for error in result} <= {victim + 1, None}, (lines[victim], result)
            assert all(len(error.message) <= MAX_MESSAGE_CHARS for error in result)
