"""StructuredOutput: the constraint one request's text must follow, checked on construction.

A user writes it as a dict with exactly one kind:

    {"json_schema": <schema dict or JSON string>}   a JSON document valid under the schema
    {"json_object": true}                           any JSON object
    {"regex": "<pattern>"}                          the whole text matches the pattern
    {"choice": ["a", "b", ...]}                     exactly one of the strings
    {"grammar": "<EBNF as xgrammar reads it>"}      a text of the grammar (root rule: root)

A JSON document (json_schema, json_object) is compact by default: one line, with ", " and
": " between items, keys and values as json.dumps writes them (xgrammar's any_whitespace=False).
Under xgrammar's own default, any whitespace, a sampling model can run on in spaces and
newlines until max_tokens; whitespace="any" (SamplingParams.structured_whitespace) keeps it.
Regexes, choices and grammars spell their own whitespace: the option leaves them alone.

Checking compiles the grammar without a tokenizer (xgrammar's parsers, a millisecond or
so), so a schema, regex or grammar that cannot be compiled is refused here, before any
engine time; compiling it against a model's vocabulary is engine.generate.grammar's job.
xgrammar is imported only when a constraint is used: it pulls in transformers.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from functools import lru_cache

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")
JSON_KINDS = ("json_schema", "json_object")
WHITESPACES = ("compact", "any")     # between a JSON document's tokens; "compact" is the default
# xgrammar's C++ errors start with a time stamp, a source location and sometimes a check.
_NATIVE_PREFIX = re.compile(r"^(\[[^\]]*\]\s*)?(\S+\.cc:\d+:\s*)?(Check failed: \(.*?\) is false:\s*)?")


@dataclass(frozen=True)
class StructuredOutput:
    """One request's constraint in canonical form; hashable, so it keys the grammar cache."""

    kind: str       # one of KINDS
    source: str     # json_schema: the schema as JSON text (key order kept: it is the output's order);
                    # choice: the strings as a JSON list; regex, grammar: as given; json_object: ""
    any_whitespace: bool = False    # JSON_KINDS only: any whitespace between tokens, not compact;
                                    # always False for the other kinds, so they share one cache entry

    @classmethod
    def parse(cls, value: "StructuredOutput | dict | None", whitespace: str = "compact") -> "StructuredOutput | None":
        """A StructuredOutput from what a user wrote, its JSON whitespace as `whitespace` says
        (one of WHITESPACES); ValueError naming `structured` or `structured_whitespace` otherwise."""
        if whitespace not in WHITESPACES:
            raise ValueError(f"structured_whitespace must be one of {', '.join(map(repr, WHITESPACES))}, "
                             f"got {whitespace!r}")
        if value is None:
            return None
        if isinstance(value, StructuredOutput):
            return value.with_whitespace(whitespace)
        if not isinstance(value, dict):
            raise ValueError(f"structured must be a dict with one of {', '.join(KINDS)}, got {type(value).__name__}")
        unknown = sorted(str(key) for key in value if key not in KINDS)
        if unknown:
            raise ValueError(f"structured has unknown kind {', '.join(unknown)}; expected exactly one of {', '.join(KINDS)}")
        if len(value) != 1:
            given = ", ".join(value) or "none"
            raise ValueError(f"structured must have exactly one of {', '.join(KINDS)}, got {given}")
        (kind, argument), = value.items()
        structured = cls(kind, _canonical_source(kind, argument)).with_whitespace(whitespace)
        _check_compiles(structured)
        return structured

    def with_whitespace(self, whitespace: str) -> "StructuredOutput":
        any_whitespace = whitespace == "any" and self.kind in JSON_KINDS
        if any_whitespace == self.any_whitespace:
            return self
        return dataclasses.replace(self, any_whitespace=any_whitespace)

    def to_dict(self) -> dict:
        """The user's form again (choice comes back as its list), e.g. for a job's manifest."""
        if self.kind in ("json_schema", "choice"):
            return {self.kind: json.loads(self.source)}
        if self.kind == "json_object":
            return {"json_object": True}
        return {self.kind: self.source}


def _canonical_source(kind: str, argument: object) -> str:
    if kind == "json_schema":
        return _schema_text(argument)
    if kind == "json_object":
        if argument is not True:
            raise ValueError(f"structured.json_object must be true, got {argument!r}")
        return ""
    if kind == "choice":
        return _choice_list(argument)
    if not isinstance(argument, str) or not argument:
        raise ValueError(f"structured.{kind} must be a non-empty string, got {argument!r}")
    return argument


def _schema_text(schema: object) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as error:
            raise ValueError(f"structured.json_schema is not valid JSON: {error}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"structured.json_schema must be a JSON object (a schema), got {type(schema).__name__}")
    return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))


def _choice_list(choices: object) -> str:
    if not isinstance(choices, (list, tuple)) or not choices:
        raise ValueError(f"structured.choice must be a non-empty list of strings, got {choices!r}")
    if not all(isinstance(choice, str) and choice for choice in choices):
        raise ValueError(f"structured.choice must hold non-empty strings, got {choices!r}")
    return json.dumps(list(dict.fromkeys(choices)), ensure_ascii=False)


def _choice_ebnf(source: str) -> str:
    # A JSON string literal is a valid EBNF literal for xgrammar (the same escapes).
    return "root ::= " + " | ".join(json.dumps(choice, ensure_ascii=False) for choice in json.loads(source))


def _check_compiles(structured: StructuredOutput) -> None:
    try:
        grammar_of(structured)
    except RuntimeError as error:       # xgrammar's parsers raise RuntimeError with a C++ location
        raise ValueError(f"structured.{structured.kind} does not compile: {native_message(error)}") from None


@lru_cache(maxsize=256)
def grammar_of(structured: StructuredOutput):
    """The xgrammar Grammar (not yet compiled against a vocabulary); RuntimeError if invalid.
    json_schema is strict (no properties beyond the schema: xgrammar's default); both JSON
    kinds are compact unless any_whitespace (module docstring)."""
    import xgrammar
    if structured.kind == "json_schema":
        return xgrammar.Grammar.from_json_schema(structured.source, any_whitespace=structured.any_whitespace)
    if structured.kind == "json_object":
        return xgrammar.Grammar.from_json_schema(json.dumps({"type": "object"}), strict_mode=False,
                                                 any_whitespace=structured.any_whitespace)
    if structured.kind == "regex":
        return xgrammar.Grammar.from_regex(structured.source)
    if structured.kind == "choice":
        return xgrammar.Grammar.from_ebnf(_choice_ebnf(structured.source))
    return xgrammar.Grammar.from_ebnf(structured.source)


def native_message(error: Exception) -> str:
    return _NATIVE_PREFIX.sub("", str(error).strip()).strip()


def from_response_format(response_format: dict | None) -> dict | None:
    """OpenAI's `response_format` as the `structured` dict: {"type": "json_schema",
    "json_schema": {"name", "schema", "strict"}} -> {"json_schema": schema};
    {"type": "json_object"} -> {"json_object": True}; {"type": "text"} or None -> None.
    ValueError naming response_format for anything else (the caller's 400). The document is
    compact, as for every request that does not set structured_whitespace="any"."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise ValueError("response_format.json_schema.schema must be a JSON schema object")
        return {"json_schema": schema}
    raise ValueError(f"response_format.type must be text, json_object or json_schema, got {kind!r}")
