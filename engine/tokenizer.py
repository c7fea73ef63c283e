"""Tokenizer: tokenizer.json through the `tokenizers` library, truncating, never padding."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer


class Tokenizer:
    """Turns texts into token ids, special tokens included, at most max_length each.

    Padding stays off: batches are padded by the engine after sorting by length, so a
    short text never pays for a long neighbour it will not be batched with.
    """

    def __init__(self, tokenizer: HFTokenizer, max_length: int, do_lower_case: bool = False):
        tokenizer.no_padding()
        # max_length counts the special tokens the post-processor adds ([CLS], [SEP]).
        tokenizer.enable_truncation(max_length=max_length)
        self._tokenizer = tokenizer
        self.max_length = max_length
        self.do_lower_case = do_lower_case

    @classmethod
    def from_folder(cls, folder: str | Path, max_length: int, do_lower_case: bool = False) -> "Tokenizer":
        path = Path(folder) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer.json not found in model folder {folder}")
        return cls(HFTokenizer.from_file(str(path)), max_length, do_lower_case)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if self.do_lower_case:
            texts = [text.lower() for text in texts]
        return [encoding.ids for encoding in self._tokenizer.encode_batch(texts)]
