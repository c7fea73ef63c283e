"""What a row of a classify or score call must be: a bad row is its row's error."""

import pytest

from engine.score.rows import RowError, as_row, pair_error

CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


@pytest.mark.parametrize("value, expected", [
    ("a text", "a text"),
    (("premise", "hypothesis"), ("premise", "hypothesis")),
    (["premise", "hypothesis"], ("premise", "hypothesis")),          # a Parquet list of two strings
    (CHAT, CHAT),
    (None, RowError("row is null")),
    ([{"role": "user"}], RowError("chat messages must each be {'role': str, 'content': str}")),
    (["one", "two", "three"], RowError("row is not a text, a pair of texts or chat messages (got list)")),
    ([], RowError("row is not a text, a pair of texts or chat messages (got list)")),
    (3, RowError("row is not a text, a pair of texts or chat messages (got int)")),
])
def test_as_row(value, expected):
    assert as_row(value) == expected


@pytest.mark.parametrize("query, document, error", [
    ("q", "d", None), ("q", "", None), (None, "d", "query is null"), ("q", None, "document is null"),
    ("q", 3, "document is not a string (got int)"),
])
def test_pair_error(query, document, error):
    assert pair_error(query, document) == error
