"""Tokenizer: tokenizer.json through the `tokenizers` library, never padding; and
tokenize_ahead, the embedder's feed of token ids chunk by chunk.

NOTE: tokenize_ahead keeps at most `depth` chunks tokenized or in flight ahead of the
model, on a pool of threads (the Rust tokenizer releases the GIL). Bounded, so a corpus
of millions of rows never sits tokenized in memory at once; ordered, so chunk i is
yielded before chunk i + 1 whichever thread finishes first; and a chunk whose
tokenization raised raises when the consumer reaches it, after the chunks before it.
On CPU one thread tokenizes ahead (the cores run the model); on a GPU several do, as
the host's tokenization is what starved the device (../shared/gpu/README.md).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Executor, Future
from itertools import islice
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer


class Tokenizer:
    """Turns texts into token ids, special tokens included.

    Padding stays off: the engine packs texts end to end, so nothing is ever padded.
    Two instances of the same tokenizer are kept, one truncating at max_length and one
    not (to count the tokens of a text that will be refused), because truncation is
    state of the Rust object and batches may be encoded from a background thread.
    """

    def __init__(self, tokenizer: HFTokenizer, max_length: int, do_lower_case: bool = False):
        serialized = tokenizer.to_str()
        self._truncating = HFTokenizer.from_str(serialized)
        self._truncating.no_padding()
        # max_length counts the special tokens the post-processor adds ([CLS], [SEP]).
        self._truncating.enable_truncation(max_length=max_length)
        self._whole = HFTokenizer.from_str(serialized)
        self._whole.no_padding()
        self._whole.no_truncation()
        self.max_length = max_length
        self.do_lower_case = do_lower_case

    @classmethod
    def from_folder(cls, folder: str | Path, max_length: int, do_lower_case: bool = False) -> "Tokenizer":
        path = Path(folder) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer.json not found in model folder {folder}")
        return cls(HFTokenizer.from_file(str(path)), max_length, do_lower_case)

    def encode_batch(self, texts: list[str], truncate: bool = True) -> list[list[int]]:
        """Token ids per text; with truncate=False a text may run past max_length."""
        if self.do_lower_case:
            texts = [text.lower() for text in texts]
        tokenizer = self._truncating if truncate else self._whole
        return [encoding.ids for encoding in tokenizer.encode_batch_fast(texts)]


def tokenize_ahead(tokenizer: Tokenizer, chunks: Iterable[list[str]], truncate: bool, pool: Executor,
                   depth: int) -> Iterator[list[list[int]]]:
    """The token ids of each chunk of texts, in order, with at most `depth` (>= 1) chunks
    submitted to `pool` ahead of the consumer."""
    if depth < 1:
        raise ValueError(f"depth must be at least 1, got {depth}")
    chunks = iter(chunks)
    in_flight: deque[Future] = deque(pool.submit(tokenizer.encode_batch, chunk, truncate)
                                     for chunk in islice(chunks, depth))
    while in_flight:
        token_ids = in_flight.popleft().result()
        following = next(chunks, None)
        if following is not None:
            in_flight.append(pool.submit(tokenizer.encode_batch, following, truncate))
        yield token_ids
