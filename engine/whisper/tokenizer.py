"""WhisperTokenizer: the special token ids of a checkpoint, and text from token ids.

Special ids follow from the vocabulary size alone: after the byte-level BPE (50257
tokens multilingual, 50256 English-only) come <|endoftext|>, <|startoftranscript|>,
one token per language, translate, transcribe, startoflm, startofprev, nospeech,
notimestamps, then 1501 timestamps <|0.00|> .. <|30.00|>.
"""

from __future__ import annotations

import string
from pathlib import Path

from engine.whisper.config import WhisperConfig

# openai-whisper's language order (whisper.tokenizer.LANGUAGES); large-v3 adds "yue".
LANGUAGE_CODES = (
    "en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no th ur hr bg lt "
    "la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl mr pa si km sn yo so af oc "
    "ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt haw ln ha ba jw su yue").split()
TASKS = ("transcribe", "translate")
# Languages written without spaces between words: their words are split wherever the
# tokens so far decode to whole characters (openai-whisper's rule; no morphology here).
UNSPACED_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})
REPLACEMENT_CHAR = "\ufffd"
NUM_TIMESTAMPS = 1501
_SPECIALS_AFTER_LANGUAGES = 6   # translate, transcribe, startoflm, startofprev, nospeech, notimestamps


class WhisperTokenizer:
    def __init__(self, config: WhisperConfig, folder: Path):
        self.is_multilingual = config.is_multilingual
        self.eot = 50257 if self.is_multilingual else 50256
        self.sot = self.eot + 1
        num_languages = config.n_vocab - NUM_TIMESTAMPS - _SPECIALS_AFTER_LANGUAGES - self.sot - 1
        if not 0 < num_languages <= len(LANGUAGE_CODES):
            raise ValueError(f"vocabulary size {config.n_vocab} is not a Whisper vocabulary")
        self.language_ids = {code: self.sot + 1 + i for i, code in enumerate(LANGUAGE_CODES[:num_languages])}
        after = self.sot + 1 + num_languages
        self.translate, self.transcribe, self.sot_lm, self.sot_prev, self.no_speech, self.no_timestamps = (
            range(after, after + _SPECIALS_AFTER_LANGUAGES))
        self.timestamp_begin = after + _SPECIALS_AFTER_LANGUAGES
        self._decode_ids = _load_decoder(folder, self.is_multilingual)

    def check_language(self, language: str | None) -> None:
        if language is None:
            return
        if not self.is_multilingual and language != "en":
            raise ValueError(f"language {language!r}: this English-only model transcribes 'en' only")
        if language not in self.language_ids:
            raise ValueError(f"unknown language {language!r}; expected a code such as 'en', 'de', 'ja'")

    def sot_sequence(self, language: str, task: str, with_timestamps: bool) -> list[int]:
        """<|startoftranscript|> <|lang|> <|task|> [<|notimestamps|>]; just sot for .en models."""
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")
        tokens = [self.sot]
        if self.is_multilingual:
            tokens += [self.language_ids[language], self.transcribe if task == "transcribe" else self.translate]
        if not with_timestamps:
            tokens.append(self.no_timestamps)
        return tokens

    def language_of(self, token_id: int) -> str:
        return next(code for code, tid in self.language_ids.items() if tid == token_id)

    def decode(self, token_ids: list[int]) -> str:
        """Text of the plain (non-special, non-timestamp) tokens."""
        return self._decode_ids([t for t in token_ids if t < self.eot])

    def split_to_word_tokens(self, tokens: list[int], language: str | None) -> tuple[list[str], list[list[int]]]:
        """Words and the tokens of each, as openai-whisper splits them for word timing:
        at whole characters for UNSPACED_LANGUAGES; otherwise a word starts at a token
        beginning with a space, at punctuation and at a special token (the closing eot)."""
        pieces = self._split_on_characters(tokens)
        if language in UNSPACED_LANGUAGES:
            return [text for text, _ in pieces], [ids for _, ids in pieces]
        words: list[str] = []
        word_tokens: list[list[int]] = []
        for text, ids in pieces:
            # `in` on strings is a substring test: "" and runs like ".," count as punctuation, as in the reference
            starts_word = ids[0] >= self.eot or text.startswith(" ") or text.strip() in string.punctuation
            if starts_word or not words:
                words.append(text)
                word_tokens.append(list(ids))
            else:
                words[-1] += text
                word_tokens[-1].extend(ids)
        return words, word_tokens

    def _split_on_characters(self, tokens: list[int]) -> list[tuple[str, list[int]]]:
        """Runs of tokens that decode to whole characters (a character's UTF-8 bytes can
        span tokens); a special token is a run of its own."""
        full = self._decode_ids([t for t in tokens if t < self.eot])
        pieces, current, offset = [], [], 0
        for token in tokens:
            if token >= self.eot:
                if current:
                    pieces.append((self._decode_ids(current), current))
                    offset += len(pieces[-1][0])
                pieces.append(("", [token]))
                current = []
                continue
            current.append(token)
            text = self._decode_ids(current)
            bad = text.find(REPLACEMENT_CHAR)
            if bad < 0 or full[offset + bad:offset + bad + 1] == REPLACEMENT_CHAR:
                pieces.append((text, current))
                current, offset = [], offset + len(text)
        if current:
            pieces.append((self._decode_ids(current), current))
        return pieces


def _load_decoder(folder: Path, is_multilingual: bool):
    path = Path(folder) / "tokenizer.json"
    if path.is_file():
        from tokenizers import Tokenizer
        tokenizer = Tokenizer.from_file(str(path))
        return lambda ids: tokenizer.decode(ids, skip_special_tokens=False)
    try:     # an openai-whisper .pt has no tokenizer beside it: use the package's assets
        from whisper.tokenizer import get_encoding
    except ImportError:
        raise FileNotFoundError(f"no tokenizer.json beside the Whisper model in {folder}, and the openai-whisper "
                                "package (whose tiktoken assets would do) is not installed") from None
    encoding = get_encoding("multilingual" if is_multilingual else "gpt2")
    return encoding.decode
