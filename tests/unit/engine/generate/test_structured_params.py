"""SamplingParams(structured=...): exactly one valid kind, or a ValueError naming `structured`."""

import json

import pytest

from engine.generate.sampling_params import SamplingParams
from engine.generate.structured import StructuredOutput, from_response_format, grammar_of

SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}, "required": ["b"]}


@pytest.mark.parametrize("structured, kind", [
    ({"json_schema": SCHEMA}, "json_schema"),
    ({"json_schema": json.dumps(SCHEMA)}, "json_schema"),
    ({"json_object": True}, "json_object"),
    ({"regex": r"\d{3}-\d{4}"}, "regex"),
    ({"choice": ["yes", "no"]}, "choice"),
    ({"choice": ("yes", "no")}, "choice"),
    ({"grammar": 'root ::= "a" ("b" | "c")*'}, "grammar"),
])
def test_each_kind_is_accepted(structured, kind):
    params = SamplingParams(structured=structured)
    assert params.structured.kind == kind
    assert SamplingParams(structured=params.structured).structured == params.structured


def test_a_schema_keeps_its_key_order_and_the_same_schema_is_one_constraint():
    from_dict = SamplingParams(structured={"json_schema": SCHEMA}).structured
    from_text = SamplingParams(structured={"json_schema": json.dumps(SCHEMA, indent=2)}).structured
    assert from_dict == from_text and hash(from_dict) == hash(from_text)
    assert list(from_dict.to_dict()["json_schema"]["properties"]) == ["b", "a"]


def test_choice_round_trips_and_drops_duplicates():
    structured = StructuredOutput.parse({"choice": ["a \"quoted\" | b", "c", "c"]})
    assert structured.to_dict() == {"choice": ["a \"quoted\" | b", "c"]}


@pytest.mark.parametrize("structured, message", [
    ({"regex": "a", "choice": ["a"]}, "exactly one of"),
    ({}, "exactly one of"),
    ({"json": {}}, "unknown kind json"),
    ({"json_schema": {"type": "objec"}}, 'structured.json_schema does not compile: Unsupported type "objec"'),
    ({"json_schema": "{not json"}, "structured.json_schema is not valid JSON"),
    ({"json_schema": [1, 2]}, "structured.json_schema must be a JSON object"),
    ({"regex": "a(b"}, "structured.regex does not compile: Regex parsing error"),
    ({"regex": ""}, "structured.regex must be a non-empty string"),
    ({"grammar": "root ::= undefined_rule"}, "structured.grammar does not compile"),
    ({"choice": []}, "structured.choice must be a non-empty list"),
    ({"choice": ["a", ""]}, "non-empty strings"),
    ({"choice": "a"}, "structured.choice must be a non-empty list"),
    ({"json_object": False}, "structured.json_object must be true"),
    ("json", "structured must be a dict"),
])
def test_invalid_constraints_raise_naming_structured(structured, message):
    with pytest.raises(ValueError, match="structured") as error:
        SamplingParams(structured=structured)
    assert message in str(error.value)
    assert ".cc:" not in str(error.value)       # xgrammar's C++ location is not the user's business


@pytest.mark.parametrize("response_format, structured", [
    (None, None),
    ({"type": "text"}, None),
    ({"type": "json_object"}, {"json_object": True}),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}, {"json_schema": SCHEMA}),
])
def test_openai_response_format_maps_onto_the_same_dict(response_format, structured):
    assert from_response_format(response_format) == structured
    if structured is not None:
        SamplingParams(structured=structured)


@pytest.mark.parametrize("response_format", [{"type": "xml"}, {"type": "json_schema", "json_schema": {"name": "x"}}, "json"])
def test_a_response_format_that_maps_to_nothing_raises_naming_it(response_format):
    with pytest.raises(ValueError, match="response_format"):
        from_response_format(response_format)


def _accepts(structured: StructuredOutput, text: str) -> bool:
    """The whole text is a complete string of the constraint's grammar (xgrammar's matcher,
    fed characters: no vocabulary needed)."""
    import xgrammar
    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo([]))
    matcher = xgrammar.GrammarMatcher(compiler.compile_grammar(grammar_of(structured)))
    return matcher.accept_string(text) and matcher.is_completed()


@pytest.mark.parametrize("structured", [{"json_schema": {"type": "object", "properties": {"a": {"type": "integer"}},
                                                         "required": ["a"]}},
                                        {"json_object": True}])
def test_json_is_compact_by_default_and_any_whitespace_restores_xgrammars_grammar(structured):
    compact = SamplingParams(structured=structured).structured
    spaced = SamplingParams(structured=structured, structured_whitespace="any").structured
    assert not compact.any_whitespace and spaced.any_whitespace and compact != spaced    # two cache entries
    assert _accepts(compact, '{"a": 1}') and _accepts(spaced, '{"a": 1}')     # json.dumps' own spacing
    for text in ('{ "a" : 1 }', '{"a":1}', '{\n  "a": 1\n}', '{"a":    1}'):
        assert not _accepts(compact, text) and _accepts(spaced, text)


def test_whitespace_leaves_regex_choice_and_grammar_alone():
    for structured in ({"regex": r"\d+ \d+"}, {"choice": ["a b", "c"]}, {"grammar": 'root ::= "x" " "*'}):
        assert (SamplingParams(structured=structured).structured
                == SamplingParams(structured=structured, structured_whitespace="any").structured)


def test_whitespace_follows_the_params_when_a_constraint_is_reused():
    compact = SamplingParams(structured={"json_object": True}).structured
    assert SamplingParams(structured=compact, structured_whitespace="any").structured.any_whitespace


def test_an_openai_response_format_is_compact_json():
    structured = from_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}})
    params = SamplingParams(structured=structured)
    assert not params.structured.any_whitespace and _accepts(params.structured, '{"b": 1, "a": "x"}')


@pytest.mark.parametrize("kwargs, message", [
    ({"structured_whitespace": "none"}, "structured_whitespace must be one of 'compact', 'any', got 'none'"),
    ({"structured_whitespace": None}, "structured_whitespace must be one of"),
    ({"jump_forward": "yes"}, "jump_forward must be a boolean or None, got 'yes'"),
    ({"jump_forward": 1}, "jump_forward must be a boolean"),
])
def test_bad_whitespace_or_jump_forward_raise_naming_it(kwargs, message):
    with pytest.raises(ValueError) as error:
        SamplingParams(structured={"json_object": True}, **kwargs)
    assert message in str(error.value)
