"""Scheduler: which chunks decode together. Requests join whenever a slot is free and
leave the step they finish (continuous batching), so a long chunk never holds a batch
of short ones hostage.

Running rows sit in slots 0..num_running-1 of the DecoderCache (see kv_cache.py). A
chunk decoded greedily is one row; a chunk with beam_size N is N rows, one per
hypothesis (engine.whisper.beam), admitted together and released together.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from engine.whisper.kv_cache import DecoderCache
from engine.whisper.request import DecodeRequest


class Scheduler:
    def __init__(self, cache: DecoderCache, max_admit: int):
        self.cache = cache
        self.max_admit = max_admit         # encoder batch: most requests admitted in one step
        self.max_running = cache.max_slots  # rows decoded together: lowered after an out-of-memory step
        self.waiting: deque[DecodeRequest] = deque()
        self.running: list[DecodeRequest] = []    # index = slot

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: DecodeRequest, first: bool = False) -> None:
        """Queue a request; `first` puts it ahead of the queue (a fallback re-run)."""
        (self.waiting.appendleft if first else self.waiting.append)(request)

    def admit(self, is_ready: Callable[[DecodeRequest], bool]) -> list[DecodeRequest]:
        """Move ready waiting requests, in queue order, into free slots (all rows of each);
        they are returned, and their rows hold the last slots of `running`. A ready request
        that does not fit stops admission, so a beam's many slots are not starved by
        smaller requests behind it."""
        num_free = self.max_running - len(self.running)
        admitted, kept, is_blocked = [], deque(), False
        while self.waiting:
            request = self.waiting.popleft()
            if is_blocked or len(admitted) >= self.max_admit or not is_ready(request):
                kept.append(request)
            elif len(request.rows) > num_free:
                is_blocked = True
                kept.append(request)
            else:
                admitted.append(request)
                self.running.extend(request.rows)
                num_free -= len(request.rows)
        self.waiting = kept
        return admitted

    def requeue(self, requests: list[DecodeRequest]) -> None:
        """Take running requests out of their slots and put them back at the head of the
        queue, in the given order, to start over (after an out-of-memory step)."""
        self.release(requests)
        for request in reversed(requests):
            request.restart()
            self.waiting.appendleft(request)

    def release(self, finished: list[DecodeRequest]) -> None:
        """Free the slots of finished requests (every row), moving the last running row into each hole."""
        slots = sorted((self.running.index(row) for request in finished for row in request.rows), reverse=True)
        for slot in slots:
            last = len(self.running) - 1
            if slot != last:
                self.cache.move(last, slot, self.running[last].position)
                self.running[slot] = self.running[last]
            self.running.pop()

