"""Barge's decoder against transformers on small random-weight Llama, Qwen2, Qwen3 and
Mistral checkpoints (saved with save_pretrained, fp32). The reference generates one
prompt at a time, unpadded; Barge runs them all in one batch with chunked prefill, so
this checks paging, chunking and batching as well as the layers."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from engine import Engine, SamplingParams  # noqa: E402
from tests.support.random_decoders import FAMILIES, save_random_decoder  # noqa: E402

NUM_NEW_TOKENS = 12
PROMPT_LENGTHS = (1, 4, 17, 33, 70)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def checkpoint(request, tmp_path_factory):
    folder = save_random_decoder(tmp_path_factory.mktemp(request.param), request.param)
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    reference.generation_config.eos_token_id = None       # compare full lengths; ignore_eos on our side
    return folder, reference


def _prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(3, 500, (length,), generator=generator).tolist() for length in PROMPT_LENGTHS]


def test_greedy_tokens_match_transformers_in_a_mixed_batch(checkpoint):
    folder, reference = checkpoint
    engine = Engine.from_pretrained(folder, mode="generate", num_blocks=48, block_size=4, max_num_batched_tokens=24)
    prompts = _prompts()
    outputs = engine.generate(prompts, SamplingParams(max_tokens=NUM_NEW_TOKENS, temperature=0.0, ignore_eos=True))
    for prompt, output in zip(prompts, outputs):
        with torch.no_grad():
            expected = reference.generate(torch.tensor([prompt]), max_new_tokens=NUM_NEW_TOKENS, do_sample=False,
                                          pad_token_id=0)[0, len(prompt):].tolist()
        assert output.token_ids == expected, f"prompt of {len(prompt)} tokens"
        assert output.finish_reason == "length"


def test_prompt_logprobs_match_transformers_logits(checkpoint):
    folder, reference = checkpoint
    engine = Engine.from_pretrained(folder, mode="generate", num_blocks=48, block_size=4, max_num_batched_tokens=16)
    prompt = _prompts()[-1]
    output = engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0))[0]
    with torch.no_grad():
        expected = reference(torch.tensor([prompt])).logits[0].log_softmax(-1)
    assert output.prompt_logprobs[0] is None
    ours = torch.tensor([entry[token] for entry, token in zip(output.prompt_logprobs[1:], prompt[1:])])
    theirs = expected[:-1].gather(-1, torch.tensor(prompt[1:])[:, None]).squeeze(-1)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
