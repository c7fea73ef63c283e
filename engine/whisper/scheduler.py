"""Scheduler: which chunks decode together. Requests join whenever a slot is free and
leave the step they finish (continuous batching), so a long chunk never holds a batch
of short ones hostage.

Running requests sit in slots 0..num_running-1 of the DecoderCache (see kv_cache.py).
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
        self.waiting: deque[DecodeRequest] = deque()
        self.running: list[DecodeRequest] = []    # index = slot

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: DecodeRequest, first: bool = False) -> None:
        """Queue a request; `first` puts it ahead of the queue (a fallback re-run)."""
        (self.waiting.appendleft if first else self.waiting.append)(request)

    def admit(self, is_ready: Callable[[DecodeRequest], bool]) -> list[DecodeRequest]:
        """Move ready waiting requests, in queue order, into free slots; they are returned
        and hold slots len(running)-len(admitted) .. len(running)-1."""
        free = min(self.cache.max_slots - len(self.running), self.max_admit)
        admitted, kept = [], deque()
        while self.waiting:
            request = self.waiting.popleft()
            if len(admitted) < free and is_ready(request):
                admitted.append(request)
            else:
                kept.append(request)
        self.waiting = kept
        self.running.extend(admitted)
        return admitted

    def release(self, finished: list[DecodeRequest]) -> None:
        """Free the slots of finished requests, moving the last running request into each hole."""
        slots = sorted((self.running.index(request) for request in finished), reverse=True)
        for slot in slots:
            last = len(self.running) - 1
            if slot != last:
                self.cache.move(last, slot, self.running[last].position)
                self.running[slot] = self.running[last]
            self.running.pop()
