"""Structured output on the real SmolLM2-135M-Instruct (its Q4_1 GGUF, MODELS.md) against
transformers' greedy generate on the same weights, constrained by xgrammar's own HF logits
processor (xgrammar.contrib.hf.LogitsProcessor) over a grammar compiled from transformers'
tokenizer: the reference shares no code with Barge's path but xgrammar's matcher itself.

32 prompts: 16 under JSON schemas, 8 regexes, 8 choice lists. The reference compiles each
with the compiler's defaults, but for JSON whitespace: compact (any_whitespace=False), as
Barge's default. With default settings (compact JSON, no jump-forward) Barge's tokens are
the reference's on every prompt. Jump-forward (opt-in) gives text valid under the grammar,
but not always the same text: its forced tokens are xgrammar's tokenization of the forced
text (`"cels" "ius"` where the model writes `"c" "elsius"`), and the model continues
differently after tokens it would not have chosen (5 of these 32 texts differ, 8 token lists).
"""

import json
import re

import pytest
import torch

from tests.support import smollm2
from tests.support.reference_cache import computed_once

smollm2.require()
pytestmark = pytest.mark.xdist_group(smollm2.GROUP)   # one reference load for the four modules
xgrammar = pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

from xgrammar.contrib.hf import LogitsProcessor  # noqa: E402

from engine import Engine, SamplingParams  # noqa: E402

MAX_TOKENS = 48

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}},
          "required": ["name", "age", "city"]}
BOOK = {"type": "object", "properties": {"title": {"type": "string"}, "author": {"type": "string"},
                                         "year": {"type": "integer"}}, "required": ["title", "author", "year"]}
PRODUCT = {"type": "object", "properties": {"name": {"type": "string"}, "price": {"type": "number"},
                                            "in_stock": {"type": "boolean"}}, "required": ["name", "price", "in_stock"]}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "sky": {"type": "string", "enum": ["sunny", "cloudy", "rainy"]},
                                            "celsius": {"type": "integer"}}, "required": ["city", "sky", "celsius"]}
RECIPE = {"type": "object", "properties": {"dish": {"type": "string"},
                                           "ingredients": {"type": "array", "items": {"type": "string"},
                                                           "maxItems": 4}},
          "required": ["dish", "ingredients"]}
EVENT = {"type": "object", "properties": {"event": {"type": "string"},
                                          "place": {"type": "object", "properties": {"city": {"type": "string"},
                                                                                     "country": {"type": "string"}},
                                                    "required": ["city", "country"]}},
         "required": ["event", "place"]}
PHONE = r"\(\d{3}\) \d{3}-\d{4}"
DATE = r"\d{4}-\d{2}-\d{2}"
TIME = r"([01]\d|2[0-3]):[0-5]\d"
COLOR = r"#[0-9a-f]{6}"
SENTIMENTS = ["positive", "negative", "neutral"]

# (user message, constraint as Barge takes it); a schema given as JSON text is the same constraint
CASES = [
    ("Describe Alice, a 30 year old from Paris, as JSON.", {"json_schema": PERSON}),
    ("Invent a person and give their name, age and city in JSON.", {"json_schema": json.dumps(PERSON)}),
    ("Bob is 45 and lives in Berlin. Give him as JSON.", {"json_schema": PERSON}),
    ("Give a famous scientist's name, age at death and home city as JSON.", {"json_schema": PERSON}),
    ("Give the novel 1984 as JSON: title, author, year.", {"json_schema": BOOK}),
    ("Recommend a science fiction book as JSON.", {"json_schema": BOOK}),
    ("Describe a laptop for sale as JSON.", {"json_schema": PRODUCT}),
    ("A cup of coffee costs 3.50 and is available. JSON please.", {"json_schema": PRODUCT}),
    ("What's the weather like in London today? Answer as JSON.", {"json_schema": WEATHER}),
    ("Report the weather in Cairo in summer as JSON.", {"json_schema": WEATHER}),
    ("Give a recipe for pancakes as JSON with its ingredients.", {"json_schema": RECIPE}),
    ("List what goes into a salad, as JSON.", {"json_schema": RECIPE}),
    ("The Olympics 2024 took place in Paris, France. Give it as JSON.", {"json_schema": EVENT}),
    ("Name a music festival and where it happens, as JSON.", {"json_schema": EVENT}),
    ("Describe yourself as a person in JSON.", {"json_schema": PERSON}),
    ("Give a book by Jane Austen as JSON.", {"json_schema": BOOK}),
    ("What is the phone number of the White House?", {"regex": PHONE}),
    ("Write a US phone number for a pizza place.", {"regex": PHONE}),
    ("When did World War II end? Give the date.", {"regex": DATE}),
    ("What is today's date?", {"regex": DATE}),
    ("What time is lunch usually served?", {"regex": TIME}),
    ("At what time does the sun rise in summer?", {"regex": TIME}),
    ("What is the hex code of pure red?", {"regex": COLOR}),
    ("Give the hex color of the sky.", {"regex": COLOR}),
    ("Is this review positive, negative or neutral? 'The food was cold and late.'", {"choice": SENTIMENTS}),
    ("Classify: 'I loved every minute of this film.'", {"choice": SENTIMENTS}),
    ("Classify: 'The package arrived on Tuesday.'", {"choice": SENTIMENTS}),
    ("Is the sky blue? Answer yes or no.", {"choice": ["yes", "no"]}),
    ("Is fire cold? Answer yes or no.", {"choice": ["yes", "no"]}),
    ("Which is a fruit: apple, carrot or potato?", {"choice": ["apple", "carrot", "potato"]}),
    ("What color is grass?", {"choice": ["red", "green", "blue", "yellow"]}),
    ("Which language is spoken in Brazil?", {"choice": ["Spanish", "Portuguese", "English", "French"]}),
]
NUM_ANY_WHITESPACE_CASES = 4        # the first schema prompts, again with structured_whitespace="any"


def _load(**options):
    return Engine.from_pretrained(smollm2.gguf_path(), mode="generate", num_blocks=256, block_size=16, **options)


@pytest.fixture(scope="module")
def hf_tokenizer():
    return smollm2.reference_tokenizer()


@pytest.fixture(scope="module")
def prompts(hf_tokenizer):
    """Token ids, from transformers' tokenizer and chat template: both sides take the same ids."""
    return [hf_tokenizer.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True,
                                             tokenize=True, return_dict=False)
            for message, _ in CASES]


@pytest.fixture(scope="module")
def compiler(hf_tokenizer):
    info = xgrammar.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=hf_tokenizer.vocab_size)
    return xgrammar.GrammarCompiler(info)


def compile_reference(compiler, structured: dict, any_whitespace: bool = False):
    """The same constraint, compiled by xgrammar's own entry points from its user form."""
    (kind, argument), = structured.items()
    if kind == "json_schema":
        schema = argument if isinstance(argument, str) else json.dumps(argument)
        return compiler.compile_json_schema(schema, any_whitespace=any_whitespace)
    if kind == "regex":
        return compiler.compile_regex(argument)
    return compiler.compile_grammar("root ::= " + " | ".join(json.dumps(choice) for choice in argument))


@pytest.fixture(scope="module")
def reference(prompts, hf_tokenizer, compiler):
    """transformers' greedy tokens under xgrammar's HF logits processor: for a case index
    and any_whitespace, computed once (on this machine, once for all runs with the same
    prompt, constraint, weights and libraries: tests.support.reference_cache)."""
    cache = {}

    def generate(case: int, any_whitespace: bool) -> list[int]:
        model = smollm2.reference_model()
        assert model.config.vocab_size == hf_tokenizer.vocab_size
        processor = LogitsProcessor(compile_reference(compiler, CASES[case][1], any_whitespace))   # one per call
        ids = prompts[case]
        with torch.no_grad():
            return model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                  logits_processor=[processor], eos_token_id=hf_tokenizer.eos_token_id,
                                  pad_token_id=0)[0, len(ids):].tolist()

    def tokens(case: int, any_whitespace: bool = False) -> list[int]:
        if (case, any_whitespace) not in cache:
            cache[case, any_whitespace] = computed_once(
                f"smollm2-structured-{case}{'-any-whitespace' if any_whitespace else ''}",
                lambda: generate(case, any_whitespace), inputs=[prompts[case], CASES[case][1], MAX_TOKENS],
                weights=smollm2.gguf_path(), libraries=("transformers", "xgrammar"),
                sources=(__file__, smollm2.__file__))
        return cache[case, any_whitespace]
    return tokens


@pytest.fixture(scope="module")
def engine():
    return _load()      # default options: jump-forward off


def _params(**options):
    return [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, structured=structured, **options)
            for _, structured in CASES]


def test_greedy_tokens_equal_transformers_with_xgrammar_by_default(engine, prompts, reference):
    outputs = engine.generate(prompts, _params())
    different = [case for case, output in enumerate(outputs) if output.token_ids != reference(case)]
    assert different == []
    assert [o.error for o in outputs] == [None] * len(CASES)
    assert [o.finish_reason for o in outputs] == ["stop"] * len(CASES)    # every reference ended on EOS
    assert engine.llm.last_run.num_forced_tokens == 0
    for output, (_, structured) in zip(outputs, CASES):
        if "json_schema" in structured:         # compact: outside strings, a space only after "," and ":"
            skeleton = re.sub(r'"(\\.|[^"\\])*"', '""', output.text)
            assert not re.search(r"\s", skeleton.replace(", ", ",").replace(": ", ":")), output.text


def test_any_whitespace_equals_the_reference_compiled_with_it(engine, prompts, reference):
    cases = range(NUM_ANY_WHITESPACE_CASES)
    outputs = engine.generate([prompts[case] for case in cases], _params(structured_whitespace="any")[:len(cases)])
    assert [o.token_ids for o in outputs] == [reference(case, any_whitespace=True) for case in cases]
    assert any("\n" in o.text for o in outputs)      # SmolLM2 indents its JSON when allowed to


def _is_valid(output, structured: dict, matcher) -> bool:
    """Every token is accepted by a matcher of the reference's grammar; a stopped text is a
    complete document of its kind (validates under the schema, matches the regex, is a choice)."""
    if not all(matcher.accept_token(token_id) for token_id in output.token_ids):
        return False
    if output.finish_reason != "stop":
        return output.finish_reason == "length"
    (kind, argument), = structured.items()
    if kind == "json_schema":
        jsonschema.validate(json.loads(output.text), json.loads(argument) if isinstance(argument, str) else argument)
        return True
    return re.fullmatch(argument, output.text) is not None if kind == "regex" else output.text in argument


def test_jump_forward_when_asked_yields_text_valid_under_the_grammar(prompts, reference, compiler):
    """Asked of the engine (enable_jump_forward=True): every output is valid under its grammar,
    in fewer forward steps. In the same batch, requests that say jump_forward=False are the
    reference's tokens: the request's choice overrides the engine's."""
    engine = _load(enable_jump_forward=True)
    outputs = engine.generate(prompts + prompts, _params() + _params(jump_forward=False))
    jumped, stepped = outputs[:len(CASES)], outputs[len(CASES):]
    for output, (_, structured) in zip(jumped, CASES):
        assert output.error is None
        assert _is_valid(output, structured, xgrammar.GrammarMatcher(compile_reference(compiler, structured)))
    assert sum(o.finish_reason == "stop" for o in jumped) >= len(CASES) - 2
    assert [o.token_ids for o in stepped] == [reference(case) for case in range(len(CASES))]
    run = engine.llm.last_run
    assert run.num_forced_tokens > 0 and run.forward_steps_per_output_token < 1.0


def test_a_mixed_batch_is_valid_per_request_and_leaves_unconstrained_rows_as_alone(engine, prompts):
    """Schema, regex, choice and unconstrained requests (greedy and seeded sampling) share
    every step; each constrained one follows its own constraint (two of them jumping
    forward on an engine that does not by default), each unconstrained one produces what
    it produces alone."""
    free = [SamplingParams(max_tokens=24, temperature=0.0),
            SamplingParams(max_tokens=24, temperature=0.8, seed=11)]
    constrained = [SamplingParams(max_tokens=64, temperature=0.8, seed=3, structured={"json_schema": PERSON},
                                  jump_forward=True),
                   SamplingParams(max_tokens=24, temperature=0.0, structured={"regex": PHONE}, jump_forward=True),
                   SamplingParams(max_tokens=8, temperature=0.8, seed=5, structured={"choice": SENTIMENTS}),
                   SamplingParams(max_tokens=32, temperature=0.0, structured={"json_object": True})]
    batch_prompts = [prompts[0], prompts[16], prompts[0], prompts[16], prompts[24], prompts[1]]
    outputs = engine.generate(batch_prompts, free + constrained)
    assert engine.llm.last_run.num_forced_tokens > 0
    person, phone, sentiment, anything = outputs[2:]
    assert person.finish_reason == "stop"
    jsonschema.validate(json.loads(person.text), PERSON)
    assert re.fullmatch(PHONE, phone.text)
    assert sentiment.text in SENTIMENTS
    if anything.finish_reason == "stop":
        assert isinstance(json.loads(anything.text), dict)
    else:
        assert anything.text.startswith("{")
    for prompt, params, output in zip(batch_prompts, free, outputs):
        alone = engine.generate([prompt], params)[0]
        assert alone.token_ids == output.token_ids
    assert not re.fullmatch(PHONE, outputs[1].text)     # the same prompt, unconstrained, is prose
