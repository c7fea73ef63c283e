"""ScoreTokenizer: a classifier's rows -> token ids, never padded. A row is one of

    a text          "I loved it"                  tokenized with special tokens, cut at max_length
    a pair          ("a query", "a document")     tokenizer(text, text_pair) as transformers and
                                                  sentence-transformers' CrossEncoder do: special
                                                  tokens, segment ids, truncation "longest_first"
    a chat          [{"role", "content"}, ...]    the folder's chat template, ending where the
                                                  conversation ends (a reward model scores all of
                                                  it), tokenized without special tokens; never cut

Its encode_batch(rows, truncate) is the call engine.embed.tokenizer.tokenize_ahead makes,
so the classifier's rows tokenize ahead of the model as the embedder's texts do.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from engine.generate.tokenizer import TextTokenizer
from engine.score.rows import Row


@dataclass(frozen=True)
class Encoded:
    """One row's tokens."""

    token_ids: list[int]                # special tokens included
    type_ids: list[int] | None = None   # [len(token_ids)] a pair's segment of each token; None: all 0

    def __len__(self) -> int:
        return len(self.token_ids)


class ScoreTokenizer:
    """Two instances of the tokenizer, one cutting at max_length and one not (to count the
    tokens of a row that will be refused), as engine.embed.tokenizer.Tokenizer keeps."""

    def __init__(self, tokenizer: HFTokenizer, max_length: int, chat: TextTokenizer | None = None):
        serialized = tokenizer.to_str()
        self._truncating = HFTokenizer.from_str(serialized)
        self._truncating.no_padding()
        self._truncating.enable_truncation(max_length=max_length, strategy="longest_first")
        self._whole = HFTokenizer.from_str(serialized)
        self._whole.no_padding()
        self._whole.no_truncation()
        self.max_length = max_length
        self.chat = chat        # the chat template's renderer; None: chats are refused

    @classmethod
    def from_folder(cls, folder: str | Path, max_length: int) -> "ScoreTokenizer":
        path = Path(folder) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer.json not found in model folder {folder}")
        return cls(HFTokenizer.from_file(str(path)), max_length, TextTokenizer.from_folder(folder))

    def encode_batch(self, rows: list[Row], truncate: bool = True) -> list[Encoded | str]:
        """Each row's Encoded, or why it has none (a chat the template refuses); rows are
        already checked (engine.score.rows.as_row)."""
        tokenizer = self._truncating if truncate else self._whole
        encoded: list[Encoded | str | None] = [None] * len(rows)
        texts = [row for row, value in enumerate(rows) if isinstance(value, str)]
        pairs = [row for row, value in enumerate(rows) if isinstance(value, tuple)]
        for row, encoding in zip(texts, tokenizer.encode_batch_fast([rows[row] for row in texts])):
            encoded[row] = Encoded(encoding.ids)
        for row, encoding in zip(pairs, tokenizer.encode_batch_fast([rows[row] for row in pairs])):
            encoded[row] = Encoded(encoding.ids, encoding.type_ids if any(encoding.type_ids) else None)
        for row, value in enumerate(rows):
            if encoded[row] is None:
                encoded[row] = self._encode_chat(value)
        return encoded

    def _encode_chat(self, messages: list[dict]) -> Encoded | str:
        if self.chat is None:
            return "this model has no chat template"
        try:
            text = self.chat.apply_chat_template(messages, add_generation_prompt=False)
        except ValueError as error:
            return str(error)
        # The template wrote the special tokens (BOS and all) it wants.
        return Encoded(self._whole.encode(text, add_special_tokens=False).ids)
