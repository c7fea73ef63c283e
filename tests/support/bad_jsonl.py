"""A generated corpus of OpenAI batch input lines that break JSONL in every way we know
of, each with what `parse_batch` must say of it: the code and param of its one error, or
(code None) that it is accepted, with the text its message must keep exactly.

Files are built from the cases with a good request before each case, blank lines among
them and a chosen line end, so that a test can check each bad line is named by its
physical line number and no good line beside it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from api.batch_input import CHAT, EMBEDDINGS
from api.json_lines import MAX_DEPTH

MODELS = {"smollm2": "generate", "minilm": "embed"}   # model -> mode, as served_models() gives
HOLE = "\u0001HOLE\u0001"   # where a case's raw text goes in an encoded line (json escapes it: never raw)


@dataclass(frozen=True)
class Case:
    name: str                    # what breaks, as the test id
    line: bytes                  # one physical line, without its line end
    code: str | None             # the LineError code of its one error; None: accepted
    param: str | None = None     # that error's param
    content: str | None = None   # accepted: its first message's content, exactly
    endpoint: str = CHAT


def request(custom_id: str, content: object = "Hi", endpoint: str = CHAT, **fields) -> dict:
    if endpoint == EMBEDDINGS:
        body = {"model": "minilm", "input": content, **fields}
    else:
        body = {"model": "smollm2", "messages": [{"role": "user", "content": content}], **fields}
    return {"custom_id": custom_id, "method": "POST", "url": endpoint, "body": body}


def encoded(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


def spliced(value: object, raw: str) -> bytes:
    """`value` encoded with the string HOLE replaced by `raw`, unescaped: bytes json.dumps never writes."""
    return encoded(value).replace(json.dumps(HOLE).encode(), raw.encode())


def corpus() -> list[Case]:
    return [*truncated(), *huge_numbers(), *deep_nesting(), *lone_surrogates(), *nul_bytes(), *byte_order_marks(),
            *line_breaks_in_strings(), *wrong_types(), *long_values()]


def truncated() -> list[Case]:
    full = encoded(request("cut", "a whole request, cut short"))
    return [Case(f"truncated-at-{end}", full[:end], "invalid_json_line") for end in range(1, len(full), 9)]


def huge_numbers() -> list[Case]:
    cases = [Case("top-level-5000-digits", b"1" * 5000, "invalid_json_line")]
    for field, number in [("max_tokens", "1" * 5000), ("seed", "-" + "9" * 4301), ("seed", str(1 << 64)),
                          ("temperature", "1e400"), ("temperature", "-1e400"), ("temperature", "NaN"),
                          ("temperature", "Infinity"), ("temperature", "-Infinity")]:
        line = spliced(request(f"number-{field}-{number[:8]}", **{field: HOLE}), number)
        cases.append(Case(f"{field}={number[:12]}", line, "invalid_json_line"))
    cases.append(Case("seed-int64-max", encoded(request("seed-max", seed=(1 << 63) - 1)), None, content="Hi"))
    return cases


def deep_nesting() -> list[Case]:
    cases = []
    for depth in (MAX_DEPTH + 1, 1000, 100_000):
        cases += [Case(f"array-line-{depth}", b"[" * depth + b"]" * depth, "invalid_json_line"),
                  Case(f"object-line-{depth}", b'{"a":' * depth + b"1" + b"}" * depth, "invalid_json_line"),
                  Case(f"array-content-{depth}", spliced(request(f"arrays-{depth}", HOLE), "[" * depth + "]" * depth),
                       "invalid_json_line"),
                  Case(f"mixed-body-{depth}", spliced(request(f"mixed-{depth}", tools=HOLE),
                                                      '[{"a":' * depth + "0" + "}]" * depth), "invalid_json_line")]
    at_limit = request("schema-at-limit", response_format=_nested_schema(MAX_DEPTH))
    over = request("schema-over-limit", response_format=_nested_schema(MAX_DEPTH + 1))
    return [*cases, Case("schema-at-depth-limit", encoded(at_limit), None, content="Hi"),
            Case("schema-over-depth-limit", encoded(over), "invalid_json_line")]


def _nested_schema(line_depth: int) -> dict:
    """A response_format whose line nests exactly `line_depth` deep: line > body >
    response_format > json_schema > schema, then one level per array schema."""
    schema: dict = {"type": "string"}
    for _ in range(line_depth - 5):
        schema = {"type": "array", "items": schema}
    return {"type": "json_schema", "json_schema": {"name": "deep", "schema": schema}}


def lone_surrogates() -> list[Case]:
    cases = [Case(f"lone-surrogate-content-{escape}", spliced(request(f"lone-{escape}", HOLE), f'"x{escape}y"'),
                  "invalid_json_line") for escape in ("\\ud800", "\\udfff", "\\udc00\\ud800", "\\ud83d")]
    cases += [Case("lone-surrogate-custom-id", b'{"custom_id": "\\ud800", "method": "POST"}', "invalid_json_line"),
              Case("lone-surrogate-key", encoded(request("lone-key")).replace(b'"body": {', b'"body": {"\\udbff": 1, '),
                   "invalid_json_line"),
              Case("surrogate-pair", spliced(request("pair", HOLE), '"\\ud83d\\ude00"'), None, content="\U0001F600"),
              Case("escaped-backslash-then-ud800", spliced(request("not-an-escape", HOLE), '"\\\\ud800"'), None,
                   content="\\ud800")]
    return cases


def nul_bytes() -> list[Case]:
    return [Case("nul-in-string", spliced(request("nul-in", HOLE), '"a\x00b"'), "invalid_json_line"),
            Case("nul-between-tokens", encoded(request("nul-between")).replace(b", ", b",\x00 ", 1),
                 "invalid_json_line"),
            Case("nul-line", b"\x00", "invalid_json_line"),
            Case("escaped-nul", spliced(request("nul-escaped", HOLE), '"a\\u0000b"'), None, content="a\x00b")]


def byte_order_marks() -> list[Case]:
    """A BOM at the file's start is each file builder's choice (`file_of(bom=True)`)."""
    return [Case("bom-starting-a-later-line", "\ufeff".encode() + encoded(request("bom-mid")), "invalid_json_line"),
            Case("bom-in-a-string", encoded(request("bom-string", "\ufeffHi")), None, content="\ufeffHi")]


def line_breaks_in_strings() -> list[Case]:
    """str.splitlines breaks at each of these; JSON takes U+2028, U+2029 and U+0085 raw in
    a string, but control characters (below U+0020) only escaped (RFC 8259 section 7)."""
    cases = [Case(f"raw-{ord(char):04x}", encoded(request(f"raw-{ord(char):x}", f"a{char}b")), None,
                  content=f"a{char}b") for char in "\u2028\u2029\x85"]
    cases += [Case(f"escaped-{ord(char):04x}", encoded(request(f"esc-{ord(char):x}", f"a{char}b")), None,
                   content=f"a{char}b") for char in "\x0c\x1c\x1d\x1e\x0b\u2028"]
    cases += [Case(f"raw-control-{ord(char):02x}", spliced(request(f"ctl-{ord(char):x}", HOLE), f'"a{char}b"'),
                   "invalid_json_line") for char in "\x0c\x1c\x1d\x1e\x0b"]
    cases += [Case(f"outside-strings-{ord(char):04x}", encoded(request(f"out-{ord(char):x}")).replace(
        b", ", f",{char}".encode(), 1), "invalid_json_line") for char in "\u2028\x0c\x85"]
    return [*cases, Case("form-feed-line", b"\x0c", "invalid_json_line")]


def wrong_types() -> list[Case]:
    """Every JSON type where an object, a list or a string belongs."""
    values = {"null": None, "number": 1, "float": 1.5, "string": "s", "array": [], "bool": True, "object": {}}
    cases = []
    for kind, value in values.items():
        if kind != "object":
            cases.append(Case(f"line-is-{kind}", encoded(value), "invalid_json_line"))
            cases.append(Case(f"message-is-{kind}", encoded(_with_messages(f"msg-{kind}", [value])), "invalid_value",
                              "body.messages[0]"))
            cases.append(Case(f"part-is-{kind}", encoded(request(f"part-{kind}", [value])), "invalid_value",
                              "body.messages[0].content"))
            body_code = "missing_required_parameter" if value is None else "invalid_value"
            cases.append(Case(f"body-is-{kind}", encoded({**request(f"body-{kind}"), "body": value}), body_code,
                              "body"))
        if kind != "array":
            cases.append(Case(f"messages-is-{kind}", encoded(_with_messages(f"msgs-{kind}", value)),
                              "missing_required_parameter", "body.messages"))
        if kind != "string":   # an empty list too: input must be a non-empty string or list of them
            cases.append(Case(f"embed-input-is-{kind}", encoded(request(f"input-{kind}", value, EMBEDDINGS)),
                              "invalid_value", "body.input", endpoint=EMBEDDINGS))
        if kind not in ("array", "string"):
            cases.append(Case(f"content-is-{kind}", encoded(request(f"content-{kind}", value)), "invalid_value",
                              "body.messages[0].content"))
        if kind != "string":
            cases.append(Case(f"custom-id-is-{kind}", encoded({**request("x"), "custom_id": value}),
                              "missing_required_parameter", "custom_id"))
            cases.append(Case(f"model-is-{kind}", encoded(request(f"model-{kind}", model=value)),
                              "missing_required_parameter", "body.model"))
        if kind != "null":   # null: no response_format
            cases.append(Case(f"response-format-is-{kind}", encoded(request(f"rf-{kind}", response_format=value)),
                              "invalid_value", "body.response_format"))
        if kind != "object":
            json_schema = {"type": "json_schema", "json_schema": value}
            cases.append(Case(f"json-schema-is-{kind}", encoded(request(f"js-{kind}", response_format=json_schema)),
                              "invalid_value", "body.response_format"))
    return cases


def _with_messages(custom_id: str, messages: object) -> dict:
    line = request(custom_id)
    return {**line, "body": {**line["body"], "messages": messages}}


def long_values() -> list[Case]:
    """Values of a megabyte where an error message echoes what it got."""
    huge = "x" * 1_000_000
    long_fields = {f"{index}{huge[:100_000]}": 1 for index in range(6)}
    return [Case("long-method", encoded({**request("long-method"), "method": huge}), "invalid_value", "method"),
            Case("long-url", encoded({**request("long-url"), "url": "/v1/" + huge}), "mismatched_endpoint", "url"),
            Case("long-custom-id", encoded(request(huge)), "invalid_value", "custom_id"),
            Case("long-model", encoded(request("long-model", model=huge)), "model_not_found", "body.model"),
            Case("long-temperature", encoded(request("long-temp", temperature=[1] * 100_000)), "invalid_value",
                 "body.temperature"),
            Case("long-response-format-type", encoded(request("long-rf", response_format={"type": huge})),
                 "invalid_value", "body.response_format"),
            Case("long-unknown-fields", encoded(request("long-fields", **long_fields)), "unsupported_parameter",
                 f"body.0{'x' * 44}...")]


@dataclass(frozen=True)
class BatchFile:
    data: bytes
    errors: list[tuple]   # (line, code, param) parse_batch must give, in order
    accepted: list[Case]  # the accepted cases, in order


def file_of(cases: list[Case], line_end: bytes = b"\n", bom: bool = False) -> BatchFile:
    """A good request before each case and after the last, a blank line after every third
    case, each line ended by `line_end`: the cases' errors named by physical line number."""
    lines, errors = [], []
    for index, case in enumerate(cases):
        lines.append(encoded(request(f"good-{index}", endpoint=case.endpoint)))
        lines.append(case.line)
        if case.code is not None:
            errors.append((len(lines), case.code, case.param))
        if index % 3 == 2:
            lines.append(b" \t")
    lines.append(encoded(request("good-last", endpoint=cases[-1].endpoint)))
    data = b"".join(line + line_end for line in lines)
    return BatchFile(("\ufeff".encode() if bom else b"") + data, errors, [c for c in cases if c.code is None])
