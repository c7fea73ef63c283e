"""Bad rows become outputs with .error and the rest of the batch runs; bad parameters are
refused with a ValueError naming them. Nothing crashes the worker."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

from engine import Engine, SamplingParams  # noqa: E402
from tests.support.random_decoders import save_random_decoder  # noqa: E402

GREEDY = SamplingParams(max_tokens=3, temperature=0.0)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = save_random_decoder(tmp_path_factory.mktemp("qwen2"), "qwen2")
    return Engine.from_pretrained(folder, mode="generate", num_blocks=64, block_size=4, max_model_len=64)


@pytest.mark.parametrize("prompt, error", [
    ("", "prompt is empty"), ([], "prompt is empty"), (None, "prompt is null"),
    ("word " * 200, "the context holds 64"), ([1, 2, 10**6], "token ids must be ints"),
    ([1, "a"], "token ids must be ints"), (3.5, "not text, token ids or messages"),
    ([{"role": "user", "content": "hi"}, {"no": "role"}], "chat messages must each be"),
])
def test_a_bad_prompt_is_a_row_error_beside_good_rows(engine, prompt, error):
    before, bad, after = engine.generate(["good row", prompt, [5, 6, 7]], GREEDY)
    assert before.is_ok and after.is_ok and before.num_output_tokens == 3
    assert error in bad.error and bad.finish_reason is None and bad.token_ids == []


@pytest.mark.parametrize("params, name", [
    (dict(max_tokens=0), "max_tokens"), (dict(temperature=-0.5), "temperature"),
    (dict(temperature=float("nan")), "temperature"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(top_k=0), "top_k"), (dict(seed=-1), "seed"), (dict(stop=[""]), "stop"),
    (dict(stop_token_ids=[-3]), "stop_token_ids"), (dict(logprobs=-1), "logprobs"),
    (dict(prompt_logprobs=1.5), "prompt_logprobs"), (dict(max_tokens=True), "max_tokens"),
])
def test_impossible_sampling_params_name_the_parameter(params, name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**params)


@pytest.mark.parametrize("params, name", [
    (SamplingParams(stop_token_ids=[10**6]), "stop_token_ids"), (SamplingParams(logprobs=10**6), "logprobs"),
])
def test_params_beyond_the_vocabulary_are_refused_before_anything_runs(engine, params, name):
    with pytest.raises(ValueError, match=name):
        engine.generate(["hello"], params)


def test_params_must_match_the_prompts(engine):
    with pytest.raises(ValueError, match="params has 1 entries for 2 prompts"):
        engine.generate(["a", "b"], [GREEDY])


def test_a_chat_prompt_without_a_template_is_a_row_error(tmp_path):
    folder = save_random_decoder(tmp_path, "mistral")
    (folder / "tokenizer_config.json").unlink()
    engine = Engine.from_pretrained(folder, mode="generate", num_blocks=16)
    output = engine.generate([[{"role": "user", "content": "hi"}]], GREEDY)[0]
    assert "no chat template" in output.error


def test_unsupported_models_and_options_are_refused(tmp_path, engine):
    with pytest.raises(ValueError, match="quantization"):
        Engine.from_pretrained(tmp_path, mode="generate", quantization="int3")
    with pytest.raises(ValueError, match="max_num_seqs"):
        Engine.from_pretrained(tmp_path, mode="generate", max_num_seqs=0)
    with pytest.raises(FileNotFoundError, match="model not found"):
        Engine.from_pretrained(tmp_path / "missing", mode="generate")
    with pytest.raises(ValueError, match="mode='generate'"):
        Engine("embed").generate(["x"])
