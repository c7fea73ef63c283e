"""BlockManager: hands out fixed-size KV-cache blocks and shares full ones by content hash.

    request tokens:  [t0 .. t15 | t16 .. t31 | t32 t33 _ _ ...]    block_size 16
    block table:     [    7     |     2      |       9        ]    physical block ids
    block hashes:    [ h(t0..15), h(h0, t16..31) ]                 full blocks only, chained

A full block whose tokens are computed is registered under its chained hash, so a
later request with the same prefix takes it instead of recomputing it. A freed block
keeps its hash and waits in the free list (least recently freed first out); it is
forgotten only when handed out for new tokens.

Pins: the scheduler pins the block hashes of every waiting request's prompt
(pin_prefix / unpin_prefix). A free block whose hash is pinned is one a waiting request
will take from the cache, so eviction passes over it to the least recently freed block
nobody waits for: a template's blocks outlive the other rows' blocks while rows of that
template still wait. Pins order eviction and never refuse it: with every free block
pinned the least recently freed goes, as without pins.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass

from engine.generate.request import Request


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None               # set while the block is registered in the prefix cache
    token_ids: tuple[int, ...] = ()       # its tokens, checked on a hit so a hash collision cannot alias


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(block_id) for block_id in range(num_blocks)]
        self.free_block_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.hash_to_block_id: dict[int, int] = {}
        self.pinned: Counter[int] = Counter()     # block hash -> waiting requests whose prompt has that block
        self._pins: dict[int, list[int]] = {}     # request id -> the hashes it pinned

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def cacheable_block_hashes(self, request: Request) -> list[int]:
        """Hashes of the request's leading full blocks that it may take from the cache (none
        when it may not use the cache). The last token is never taken from the cache: its
        logits are needed to sample the first output token."""
        if not (self.enable_prefix_caching and request.uses_prefix_cache):
            return []
        return self._block_hashes(request, (request.num_tokens - 1) // self.block_size)

    def uncomputed_block_hashes(self, request: Request) -> list[int]:
        """Hashes of the full blocks of the request's tokens it has still to compute: what
        the cache will hold once it catches up."""
        if not self.enable_prefix_caching:
            return []
        first = request.num_computed_tokens // self.block_size
        return self._block_hashes(request, request.num_tokens // self.block_size)[first:]

    def find_cached_blocks(self, request: Request) -> list[int]:
        """Leading full blocks of the request already in the cache (of cacheable_block_hashes)."""
        hashes = self.cacheable_block_hashes(request)
        hits = []
        for index, block_hash in enumerate(hashes):
            block_id = self.hash_to_block_id.get(block_hash)
            if block_id is None or self.blocks[block_id].token_ids != self._block_tokens(request, index):
                break
            hits.append(block_id)
        return hits

    def allocate_slots(self, request: Request, num_new_tokens: int, cached_block_ids: list[int] = (),
                       num_reserved_blocks: int = 0) -> bool:
        """Blocks for num_new_tokens beyond what is computed (after the cached ones); False,
        changing nothing, when fewer than num_reserved_blocks would stay free."""
        num_computed = request.num_computed_tokens + len(cached_block_ids) * self.block_size
        num_held = len(request.block_ids) + len(cached_block_ids)
        num_needed = max(0, self.num_blocks_for(num_computed + num_new_tokens) - num_held)
        num_cached_free = sum(1 for block_id in cached_block_ids if self.blocks[block_id].ref_count == 0)
        if num_needed + num_cached_free + num_reserved_blocks > self.num_free_blocks:
            return False
        for block_id in cached_block_ids:
            self._take(block_id)
        request.block_ids.extend(cached_block_ids)
        request.num_computed_tokens = num_computed
        request.block_ids.extend(self._take_fresh() for _ in range(num_needed))
        return True

    def free(self, request: Request) -> None:
        # Tail blocks first, so the shared head of a prefix is the last to be evicted.
        for block_id in reversed(request.block_ids):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids[block_id] = None
        request.block_ids = []

    def pin_prefix(self, request: Request) -> None:
        """Keep the request's cacheable blocks from eviction while it waits (see Pins)."""
        hashes = self.cacheable_block_hashes(request)
        if hashes:
            self._pins[request.request_id] = hashes
            self.pinned.update(hashes)

    def unpin_prefix(self, request: Request) -> None:
        hashes = self._pins.pop(request.request_id, None)
        if hashes:
            self.pinned.subtract(hashes)
            for block_hash in hashes:
                if self.pinned[block_hash] <= 0:
                    del self.pinned[block_hash]

    def cache_full_blocks(self, request: Request) -> None:
        """Register the request's full, computed blocks under their hashes."""
        if not self.enable_prefix_caching:
            return
        num_full = request.num_computed_tokens // self.block_size
        hashes = self._block_hashes(request, num_full)
        for index in range(num_full):
            block = self.blocks[request.block_ids[index]]
            if block.hash is None and hashes[index] not in self.hash_to_block_id:
                block.hash, block.token_ids = hashes[index], self._block_tokens(request, index)
                self.hash_to_block_id[block.hash] = block.block_id

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_block_ids[block_id]
        block.ref_count += 1

    def _take_fresh(self) -> int:
        block_id = self._next_victim()
        del self.free_block_ids[block_id]
        block = self.blocks[block_id]
        if block.hash is not None:          # evict: its contents are about to be overwritten
            del self.hash_to_block_id[block.hash]
            block.hash, block.token_ids = None, ()
        block.ref_count = 1
        return block_id

    def _next_victim(self) -> int:
        """The least recently freed block that no waiting request has pinned; the least
        recently freed of all if every free one is pinned. A pinned block passed over goes
        to the back of the line, so a run of them is stepped over once, not on every call."""
        for _ in range(len(self.free_block_ids) if self.pinned else 0):
            block_id = next(iter(self.free_block_ids))
            block_hash = self.blocks[block_id].hash
            if block_hash is None or block_hash not in self.pinned:
                return block_id
            self.free_block_ids.move_to_end(block_id)
        return next(iter(self.free_block_ids))

    def _block_tokens(self, request: Request, index: int) -> tuple[int, ...]:
        return tuple(request.token_ids[index * self.block_size:(index + 1) * self.block_size])

    def _block_hashes(self, request: Request, num_blocks: int) -> list[int]:
        """Chained hashes of the first num_blocks full blocks, extended on the request as needed."""
        hashes = request.block_hashes
        while len(hashes) < num_blocks:
            # The first block's parent is the adapter: its K/V differ from the base model's.
            parent = hashes[-1] if hashes else request.adapter_key
            hashes.append(hash((parent, self._block_tokens(request, len(hashes)))))
        return hashes[:num_blocks]
