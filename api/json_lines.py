"""A JSONL file read as strict JSON (RFC 8259), one line at a time, as an OpenAI batch
input file is read: a line that is not JSON text becomes `NotJson` saying why, and no
line can raise anything else, recurse deeply, or yield a value that fails later.

  lines     only "\\n" ends a line, and one "\\r" before it is dropped (CRLF files).
            str.splitlines would also split on U+2028, U+2029, U+0085 (which a JSON string
            may hold raw) and on \\x0c, \\x1c-\\x1e, and shift every later line's number.
  numbers   physical, from 1: a blank line (JSON whitespace only) counts, holds no value.
  BOM       one U+FEFF at the start of the file is dropped, as utf-8-sig and common JSONL
            readers do; before a later line's value it is not JSON (that line's error).
  values    NaN, Infinity and -Infinity (Python's json takes them) are refused, as are
            floats that overflow to infinity, integers beyond 64 bits, and strings or keys
            holding a lone UTF-16 surrogate: "\\ud800" decodes in Python but is not text,
            and would fail only when written as UTF-8 to Parquet or an output file. A
            control character (U+0000-U+001F: NUL, \\x0c, \\x1c...) in a string must be
            escaped, as RFC 8259 says and json.dumps writes; raw, it is the line's error.
"""

from __future__ import annotations

import json
import math
import re
import reprlib
from collections.abc import Iterator
from itertools import accumulate

# Deepest nesting of arrays and objects a line may have. A chat line is 5 deep (line >
# body > messages > message > content parts); a response_format schema starts at 5 and
# adds 2 per nested object ({"properties": {"name": {...}}}), and OpenAI's structured
# outputs take 10 levels of nesting: 25 at most. 64 is over twice that. Python's json
# recurses once per level (1,000 frames: RecursionError, a 500 the openai client retries
# three times), so the depth is measured before parsing; it also bounds every later walk
# over a request (the surrogate check here, reprlib echoes, the schema compiler).
MAX_DEPTH = 64
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1   # no OpenAI field takes more (seed is int64)
JSON_WHITESPACE = " \t\r"
MAX_SHOWN = 48   # characters of a line's value an error message echoes: a value may be megabytes

# One JSON string, or an unterminated one to the end of the line. The closing quote is
# optional so that every match succeeds at its first try: a required one would make a
# line of 100,000 `\"` rescan the rest of the line from each of them (quadratic time).
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")   # raw surrogates are not UTF-8: only an escape makes one
_SURROGATE = re.compile("[\ud800-\udfff]")              # json joins a valid pair into one code point


class NotJson(ValueError):
    """A line that is not JSON text; the message says why, in a few words."""


def physical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number from 1, text without its line end) of every line that is not blank."""
    for number, line in enumerate(text.removeprefix("\ufeff").split("\n"), start=1):
        line = line.removesuffix("\r")
        if line.strip(JSON_WHITESPACE):
            yield number, line


def load_line(line: str) -> object:
    """The JSON value of one line, or NotJson."""
    if _is_too_deep(line):
        raise NotJson(f"arrays and objects nested more than {MAX_DEPTH} deep")
    try:
        value = _DECODER.decode(line)
    except json.JSONDecodeError as error:
        if line.startswith("\ufeff"):
            raise NotJson("a byte order mark (U+FEFF) starts this line; only the file may start with one") from None
        where = "column" if error.msg.endswith(" at") else "at column"   # "Invalid control character at"
        raise NotJson(f"{error.msg} {where} {error.colno}") from None
    if _SURROGATE_ESCAPE.search(line) and _holds_lone_surrogate(value):
        raise NotJson("a string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff), which is not text")
    return value


def json_type(value: object) -> str:
    """What a decoded value is, in JSON's words, for an error message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def shown(value: object) -> str:
    """A decoded value as an error message echoes it: its repr, cut to MAX_SHOWN characters."""
    return cut(_ECHO.repr(value))


def cut(text: str, limit: int = MAX_SHOWN) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _is_too_deep(line: str) -> bool:
    """Linear, no recursion, as fast as json.loads: a 30 MB line of 10 million `[],` takes
    1.5 s here, and 1.5 s more to parse."""
    if line.count("[") + line.count("{") <= MAX_DEPTH:   # brackets in strings included: a bound
        return False
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", line))   # strings first: brackets in them do not nest
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0) > MAX_DEPTH


def _refuse_constant(name: str) -> float:
    raise NotJson(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotJson(f"the number {cut(text, 24)} overflows a 64-bit float")
    return value


def _int64(text: str) -> int:
    if len(text) <= 20:   # first: int() of over 4,300 digits raises a plain ValueError (Python 3.11+)
        value = int(text)
        if INT64_MIN <= value <= INT64_MAX:
            return value
    raise NotJson(f"the integer {cut(text, 24)} is beyond 64 bits")


def _holds_lone_surrogate(value: object) -> bool:
    if isinstance(value, str):
        return _SURROGATE.search(value) is not None
    if isinstance(value, list):
        return any(_holds_lone_surrogate(item) for item in value)
    if isinstance(value, dict):
        return any(_holds_lone_surrogate(key) or _holds_lone_surrogate(item) for key, item in value.items())
    return False


# Built once: json.loads with hooks builds a decoder per call. With the hooks and checks,
# parse_batch reads 50,000 chat lines (33 MB) in 0.67 s, against 0.63 s with plain json.loads.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_int64)
_ECHO = reprlib.Repr()   # stops early: the repr of a long list or string is never built whole
_ECHO.maxstring = _ECHO.maxother = _ECHO.maxlong = MAX_SHOWN
_ECHO.maxlevel = 2
