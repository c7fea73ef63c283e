"""The generate mode end to end on a small random Llama: batching must not change results,
sampling is reproducible per request, and stop conditions and logprobs behave."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

from engine import Engine, SamplingParams  # noqa: E402
from tests.support.random_decoders import save_random_decoder  # noqa: E402

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_random_decoder(tmp_path_factory.mktemp("llama"), "llama")


@pytest.fixture(scope="module")
def engine(folder):
    return Engine.from_pretrained(folder, mode="generate", num_blocks=256, block_size=4)


def _mixed_prompts(count: int) -> list[list[int]]:
    """Lengths from 1 to 90; every third prompt shares a 24-token instruction prefix."""
    generator = torch.Generator().manual_seed(2)
    instruction = torch.randint(3, 500, (24,), generator=generator).tolist()
    prompts = []
    for index in range(count):
        body = torch.randint(3, 500, (1 + (index * 37) % 90,), generator=generator).tolist()
        prompts.append(instruction + body if index % 3 == 0 else body)
    return prompts


def test_each_prompt_alone_equals_its_output_in_a_large_mixed_batch(folder, engine):
    prompts = _mixed_prompts(24)
    lengths = [4 + (index * 7) % 20 for index in range(len(prompts))]
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in lengths]
    alone = [engine.generate([p], [sp])[0].token_ids for p, sp in zip(prompts, params)]
    # Few blocks and a small token budget: chunked prefill, preemption and prefix hits all happen.
    crowded = Engine.from_pretrained(folder, mode="generate", num_blocks=40, block_size=4,
                                     max_num_batched_tokens=48, max_num_seqs=16)
    batched = crowded.generate(prompts, params)
    assert [output.token_ids for output in batched] == alone
    stats = crowded.llm.last_run
    assert stats.num_preemptions > 0 and stats.num_cached_tokens > 0
    assert stats.num_generated_tokens == sum(lengths)
    assert crowded.llm.block_manager.num_free_blocks == 40


def test_a_seeded_request_gives_the_same_tokens_alone_and_in_a_batch(engine):
    prompts = _mixed_prompts(6)
    seeded = SamplingParams(max_tokens=12, temperature=1.0, top_k=50, top_p=0.9, seed=123, ignore_eos=True)
    others = SamplingParams(max_tokens=12, temperature=0.8, ignore_eos=True)
    alone = engine.generate([prompts[2]], seeded)[0].token_ids
    batch = engine.generate(prompts, [others, others, seeded, others, others, others])
    assert batch[2].token_ids == alone
    assert engine.generate([prompts[2]], SamplingParams(**{**seeded.__dict__, "seed": 124}))[0].token_ids != alone


def test_top_k_one_is_greedy(engine):
    prompts = _mixed_prompts(3)
    greedy = engine.generate(prompts, GREEDY)
    top1 = engine.generate(prompts, SamplingParams(max_tokens=10, temperature=1.5, top_k=1, ignore_eos=True))
    assert [o.token_ids for o in top1] == [o.token_ids for o in greedy]


def test_a_stop_string_cuts_the_text_and_ends_generation(engine):
    prompt = _mixed_prompts(1)[0]
    full = engine.generate([prompt], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))[0]
    stop = full.text[len(full.text) // 2:len(full.text) // 2 + 3]
    cut = engine.generate([prompt], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, stop=stop))[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[:full.text.find(stop)]
    assert full.token_ids[:len(cut.token_ids)] == cut.token_ids and len(cut.token_ids) < 20


def test_stop_token_ids_end_generation_and_stay_in_token_ids(engine):
    prompt = _mixed_prompts(1)[0]
    full = engine.generate([prompt], GREEDY)[0]
    stop_at = full.token_ids[4]
    out = engine.generate([prompt], SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=[stop_at]))[0]
    assert out.finish_reason == "stop" and out.token_ids == full.token_ids[:full.token_ids.index(stop_at) + 1]


def test_logprobs_hold_the_chosen_token_and_the_top_n(engine):
    out = engine.generate(_mixed_prompts(2), SamplingParams(max_tokens=5, temperature=0.0, logprobs=3, ignore_eos=True))
    for output in out:
        assert len(output.logprobs) == 5
        for token_id, entry in zip(output.token_ids, output.logprobs):
            assert token_id in entry and len(entry) == 3        # greedy: the chosen token is the top one
            assert entry[token_id] == max(entry.values()) and all(v <= 0 for v in entry.values())


def test_text_and_chat_prompts_go_through_the_tokenizer_and_template(engine):
    tokenizer = engine.llm.tokenizer
    messages = [{"role": "user", "content": "What does the license say about copying?"}]
    rendered = tokenizer.apply_chat_template(messages)
    assert rendered.endswith("<|im_start|>assistant\n")
    by_messages, by_ids = engine.generate([messages, tokenizer.encode(rendered, add_special_tokens=False)], GREEDY)
    assert by_messages.token_ids == by_ids.token_ids
    text = engine.generate(["This License"], GREEDY)[0]
    assert text.num_prompt_tokens == len(tokenizer.encode("This License")) and text.text


def test_outputs_come_back_in_input_order_with_counts(engine):
    prompts = _mixed_prompts(5)
    outputs = engine.generate(prompts, [SamplingParams(max_tokens=n + 1, temperature=0.0, ignore_eos=True)
                                        for n in range(5)])
    assert [o.num_output_tokens for o in outputs] == [1, 2, 3, 4, 5]
    assert [o.num_prompt_tokens for o in outputs] == [len(p) for p in prompts]


def test_requests_can_be_streamed_in_and_aborted_between_steps(engine):
    """The worker's path: rows join the running batch while others are mid-generation."""
    llm = engine.llm
    prompts = _mixed_prompts(3)
    first = llm.add_request(prompts[0], GREEDY)
    llm.step()
    second = llm.add_request(prompts[1], GREEDY)
    doomed = llm.add_request(prompts[2], SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True))
    llm.step()
    assert llm.num_unfinished_requests == 3
    llm.abort(doomed)
    llm.abort(doomed)          # an id that has ended is ignored
    finished = {}
    while llm.has_unfinished_requests:
        finished.update((done.request_id, done.output) for done in llm.step())
    assert set(finished) == {first, second}, "an aborted request is never returned"
    assert finished[first].token_ids == engine.generate([prompts[0]], GREEDY)[0].token_ids
    assert finished[second].finish_reason == "length" and llm.num_unfinished_requests == 0
    assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks


def test_a_prompt_that_cannot_run_gets_no_request_id(engine):
    llm = engine.llm
    assert llm.add_requests(["", [1, 2]], GREEDY)[0] == "prompt is empty"
    while llm.has_unfinished_requests:
        llm.step()
    with pytest.raises(ValueError, match="top_k"):
        llm.add_request([1, 2], SamplingParams(top_k=10**9))
    assert llm.num_unfinished_requests == 0
