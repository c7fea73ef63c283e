"""Prefix-aware admission (engine/generate/scheduler.py) and pins (block_manager.py), on CPU
with fabricated model outputs: a shared prefix is computed once, requests that share
nothing are admitted meanwhile, and prefix blocks a waiting request will hit outlive
other free blocks. Each test also runs first come, first served where the difference shows."""

from collections import Counter

import pytest

from engine.generate.block_manager import BlockManager
from engine.generate.prefix_order import plan_prefix_order
from engine.generate.request import Request
from engine.generate.sampling_params import SamplingParams
from engine.generate.scheduler import Scheduler, SchedulerConfig, SchedulerOutput

TOKEN = 7              # every fabricated sample
BLOCK_SIZE = 4
TEMPLATES = [list(range(100 * t, 100 * t + 12)) for t in (1, 2, 3)]     # three full blocks each


def _scheduler(prefix_aware: bool = True, num_blocks: int = 256, **config) -> Scheduler:
    config = {"max_num_seqs": 8, "max_num_batched_tokens": 32, "max_model_len": 256, "admission_reserve": 0.0,
              "prefix_aware_admission": prefix_aware, **config}
    return Scheduler(SchedulerConfig(**config), BlockManager(num_blocks, BLOCK_SIZE))


def _request(request_id: int, prompt: list[int], max_tokens: int = 3) -> Request:
    return Request(request_id, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def _step(scheduler: Scheduler, computed: Counter | None = None) -> SchedulerOutput:
    """One step, every request that reaches its end sampling TOKEN; `computed` counts each
    full block the step computes, by the prefix it closes."""
    output = scheduler.schedule()
    sampled = {}
    for request in output.requests:
        start = request.num_computed_tokens
        end = start + output.num_scheduled_tokens[request.request_id]
        for block_end in range((start // BLOCK_SIZE + 1) * BLOCK_SIZE, end + 1, BLOCK_SIZE):
            if computed is not None:
                computed[tuple(request.token_ids[:block_end])] += 1
        if end == request.num_tokens:
            sampled[request.request_id] = TOKEN
    scheduler.update_from_output(output, sampled)
    return output


def _templated_prompts() -> list[list[int]]:
    """Five rows of each template, grouped as files written per template arrive, and two
    rows that share nothing; every suffix starts with its own token (3 tokens: no full block)."""
    prompts = [template + [1000 + 10 * t + row, 1, 2] for t, template in enumerate(TEMPLATES) for row in range(5)]
    return prompts + [list(range(2000, 2014)), list(range(3000, 3011))]


@pytest.mark.parametrize("prefix_aware", [True, False])
def test_each_template_block_is_computed_once(prefix_aware):
    # Given rows of three templates arriving together, and two unrelated rows.
    scheduler = _scheduler(prefix_aware)
    prompts = _templated_prompts()
    for request_id, prompt in enumerate(prompts):
        scheduler.add_request(_request(request_id, prompt))
    # When
    computed: Counter = Counter()
    num_steps = 0
    while scheduler.has_unfinished_requests():
        _step(scheduler, computed)
        num_steps += 1
        assert num_steps < 200
    # Then: with hold-back no template block is computed twice and the prompt tokens
    # computed are the lower bound (templates are block-aligned, suffixes distinct).
    template_blocks = {tuple(t[:end]): n for t in TEMPLATES for end, n in
                       ((end, computed[tuple(t[:end])]) for end in range(BLOCK_SIZE, 13, BLOCK_SIZE))}
    lower_bound = plan_prefix_order(prompts).num_distinct_tokens
    if prefix_aware:
        assert set(template_blocks.values()) == {1}
        assert scheduler.num_prefill_tokens == lower_bound
    else:     # first come, first served: rows admitted beside their template's first row compute it again
        assert max(template_blocks.values()) > 1
        assert scheduler.num_prefill_tokens > lower_bound


def test_rows_that_share_nothing_are_admitted_while_a_template_is_computed():
    # Given
    scheduler = _scheduler(max_num_batched_tokens=48)
    prompts = _templated_prompts()
    requests = [_request(request_id, prompt) for request_id, prompt in enumerate(prompts)]
    for request in requests:
        scheduler.add_request(request)
    # When
    first = _step(scheduler)
    # Then: one row per template computes it (15 tokens each), an unrelated row behind the
    # held ones fills the budget; the templates' other rows wait, then take all three of
    # their template's blocks from the cache.
    assert [request.request_id for request in first.requests] == [0, 5, 10, 15]
    assert first.total_num_scheduled_tokens == 48
    second = _step(scheduler)
    assert {1, 2, 3, 4} <= {request.request_id for request in second.requests}
    assert all(requests[row].num_cached_tokens == 12 for row in (1, 2, 3, 4))


def test_a_template_prefilled_in_chunks_holds_its_rows_until_the_last_chunk():
    # Given a 40-token template (10 blocks) and a budget of 16 tokens a step.
    scheduler = _scheduler(max_num_batched_tokens=16)
    template = list(range(500, 540))
    leader, follower = _request(0, template + [1, 2]), _request(1, template + [3, 4])
    scheduler.add_request(leader)
    scheduler.add_request(follower)
    # When / Then: the follower waits through the leader's chunks, then computes 2 tokens.
    steps = [_step(scheduler) for _ in range(3)]
    assert all(1 not in step.num_scheduled_tokens for step in steps)
    fourth = _step(scheduler)
    assert fourth.num_scheduled_tokens[1] == 2 and follower.num_cached_tokens == 40


@pytest.mark.parametrize("prefix_aware, expected_hit", [(True, 12), (False, 4)])
def test_a_waiting_rows_template_survives_eviction_by_other_rows(prefix_aware, expected_hit):
    # Given a cache of 12 blocks, one request at a time: row A of the template ran and was
    # freed, then an unrelated row C (its blocks freed after A's: more recently used).
    scheduler = _scheduler(prefix_aware, num_blocks=12, max_num_seqs=1)
    template = TEMPLATES[0]
    for request in (_request(0, template + [1, 2], max_tokens=2), _request(1, list(range(300, 314)), max_tokens=2)):
        scheduler.add_request(request)
        while scheduler.has_unfinished_requests():
            _step(scheduler)
    # When a long unrelated row B needs 7 of the 12 blocks while row W of the template waits behind it.
    waiting = _request(3, template + [9, 9])
    scheduler.add_request(_request(2, list(range(500, 525)), max_tokens=3))
    scheduler.add_request(waiting)
    while scheduler.has_unfinished_requests():
        _step(scheduler)
    # Then: pinned, the template's three blocks outlived C's; least recently freed first, two went.
    assert waiting.num_cached_tokens == expected_hit


def test_eviction_takes_a_pinned_block_when_every_free_block_is_pinned():
    manager = BlockManager(num_blocks=3, block_size=2)
    first = _request(0, [1, 2, 3, 4, 5])
    assert manager.allocate_slots(first, 5)
    first.num_computed_tokens = 5
    manager.cache_full_blocks(first)
    manager.free(first)
    waiting = _request(1, [1, 2, 3, 4, 6])
    manager.pin_prefix(waiting)
    assert len(manager.find_cached_blocks(waiting)) == 2
    assert manager.allocate_slots(_request(2, [8] * 6), 6)        # all three blocks, the pinned among them
    assert manager.find_cached_blocks(waiting) == []
    manager.unpin_prefix(waiting)
    assert not manager.pinned


def test_finishing_or_admitting_a_waiting_request_releases_its_pins():
    scheduler = _scheduler(max_num_seqs=1)
    running, waiting = _request(0, TEMPLATES[0] + [1]), _request(1, TEMPLATES[1] + [1])
    scheduler.add_request(running)
    scheduler.add_request(waiting)
    _step(scheduler)
    assert scheduler.block_manager.pinned            # the waiting one's three blocks
    scheduler.finish(waiting, waiting.status.FINISHED_ABORTED)
    assert not scheduler.block_manager.pinned
