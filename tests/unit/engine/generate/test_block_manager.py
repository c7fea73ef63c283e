"""BlockManager: allocation, freeing, and prefix-cache hits by block hash."""

from engine.generate.block_manager import BlockManager
from engine.generate.request import Request
from engine.generate.sampling_params import SamplingParams


def _request(request_id: int, token_ids: list[int], **params) -> Request:
    return Request(request_id, token_ids, SamplingParams(**params))


def test_allocates_enough_blocks_for_the_new_tokens_and_frees_them():
    manager = BlockManager(num_blocks=8, block_size=4)
    request = _request(0, list(range(10)))
    assert manager.allocate_slots(request, 10)
    assert len(request.block_ids) == 3 and manager.num_free_blocks == 5
    request.num_computed_tokens = 10
    assert manager.allocate_slots(request, 1)          # token 11 still fits block 3
    assert len(request.block_ids) == 3
    request.num_computed_tokens = 12
    assert manager.allocate_slots(request, 1)          # token 13 opens a fourth block
    assert len(request.block_ids) == 4
    manager.free(request)
    assert request.block_ids == [] and manager.num_free_blocks == 8


def test_refuses_without_changing_anything_when_blocks_run_out():
    manager = BlockManager(num_blocks=2, block_size=4)
    request = _request(0, list(range(9)))
    assert not manager.allocate_slots(request, 9)
    assert request.block_ids == [] and manager.num_free_blocks == 2
    assert not manager.allocate_slots(_request(1, [1, 2]), 2, num_reserved_blocks=2)


def test_a_computed_prefix_is_found_by_a_later_request_and_shared():
    manager = BlockManager(num_blocks=8, block_size=4)
    first = _request(0, list(range(10)))
    manager.allocate_slots(first, 10)
    first.num_computed_tokens = 10
    manager.cache_full_blocks(first)                   # blocks 0..7 of tokens are full: two blocks
    second = _request(1, list(range(8)) + [99, 98, 97])
    cached = manager.find_cached_blocks(second)
    assert cached == first.block_ids[:2]
    assert manager.allocate_slots(second, 3, cached)
    assert second.num_computed_tokens == 8 and second.block_ids[:2] == first.block_ids[:2]
    assert manager.blocks[cached[0]].ref_count == 2


def test_the_last_prompt_token_is_never_taken_from_the_cache():
    manager = BlockManager(num_blocks=8, block_size=4)
    first = _request(0, list(range(8)))
    manager.allocate_slots(first, 8)
    first.num_computed_tokens = 8
    manager.cache_full_blocks(first)
    same = _request(1, list(range(8)))
    assert len(manager.find_cached_blocks(same)) == 1   # its logits are needed to sample


def test_a_freed_block_stays_cached_until_it_is_handed_out_again():
    manager = BlockManager(num_blocks=2, block_size=4)
    first = _request(0, list(range(5)))
    manager.allocate_slots(first, 5)
    first.num_computed_tokens = 5
    manager.cache_full_blocks(first)
    manager.free(first)
    resumed = _request(2, list(range(6)))
    assert len(manager.find_cached_blocks(resumed)) == 1
    other = _request(3, [50] * 8)                      # needs both blocks: evicts the cached one
    assert manager.allocate_slots(other, 8)
    assert manager.find_cached_blocks(resumed) == []


def test_prompt_logprobs_requests_do_not_use_the_cache():
    manager = BlockManager(num_blocks=8, block_size=4)
    first = _request(0, list(range(9)))
    manager.allocate_slots(first, 9)
    first.num_computed_tokens = 9
    manager.cache_full_blocks(first)
    assert manager.find_cached_blocks(_request(1, list(range(9)), prompt_logprobs=0)) == []


def test_equal_hashes_with_different_tokens_are_not_a_hit():
    manager = BlockManager(num_blocks=4, block_size=2)
    first = _request(0, [1, 2, 3])
    manager.allocate_slots(first, 3)
    first.num_computed_tokens = 3
    manager.cache_full_blocks(first)
    block = manager.blocks[first.block_ids[0]]
    block.token_ids = (7, 7)                           # as if another block collided on the hash
    assert manager.find_cached_blocks(_request(1, [1, 2, 5])) == []
