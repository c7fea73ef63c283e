"""TextTokenizer: text <-> token ids for the generate path, and chat messages -> prompt text."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

# llama.cpp pre-tokenizer names -> how text is split before byte-level BPE. SmolLM
# splits every digit apart; the default is GPT-2's split.
GGUF_DIGIT_SPLITTING = ("smollm",)
CONTROL_TOKEN_TYPE = 3


class TextTokenizer:
    def __init__(self, tokenizer: Tokenizer, chat_template: str | None, bos_token: str | None,
                 eos_token: str | None):
        tokenizer.no_padding()
        tokenizer.no_truncation()        # over-long prompts become per-row errors, not silent cuts
        self._tokenizer = tokenizer
        self.chat_template = chat_template
        self.bos_token, self.eos_token = bos_token, eos_token

    @classmethod
    def from_folder(cls, folder: str | Path) -> "TextTokenizer":
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer.json not found in model folder {folder}")
        config = _read_json(folder / "tokenizer_config.json")
        template = config.get("chat_template")
        if isinstance(template, list):        # named templates: the default one is for chat
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if (folder / "chat_template.jinja").is_file():
            template = (folder / "chat_template.jinja").read_text()
        return cls(Tokenizer.from_file(str(path)), template, _token_text(config.get("bos_token")),
                   _token_text(config.get("eos_token")))

    @classmethod
    def from_gguf_metadata(cls, metadata: dict) -> "TextTokenizer":
        if metadata.get("tokenizer.ggml.model") != "gpt2":
            raise ValueError(f"unsupported GGUF tokenizer {metadata.get('tokenizer.ggml.model')!r}; only 'gpt2' (byte-level BPE)")
        tokens = metadata["tokenizer.ggml.tokens"]
        merges = [tuple(merge.split(" ", 1)) for merge in metadata["tokenizer.ggml.merges"]]
        tokenizer = Tokenizer(models.BPE({token: i for i, token in enumerate(tokens)}, merges))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if metadata.get("tokenizer.ggml.pre") in GGUF_DIGIT_SPLITTING:
            tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        else:
            tokenizer.pre_tokenizer = byte_level
        tokenizer.decoder = decoders.ByteLevel()
        types = metadata.get("tokenizer.ggml.token_type") or [0] * len(tokens)
        tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                      for t, kind in zip(tokens, types) if kind == CONTROL_TOKEN_TYPE])
        bos_id, eos_id = metadata.get("tokenizer.ggml.bos_token_id"), metadata.get("tokenizer.ggml.eos_token_id")
        bos = tokens[bos_id] if bos_id is not None else None
        if metadata.get("tokenizer.ggml.add_bos_token") and bos is not None:
            tokenizer.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, bos_id)])
        eos = tokens[eos_id] if eos_id is not None else None
        return cls(tokenizer, metadata.get("tokenizer.chat_template"), bos, eos)

    @property
    def backend(self) -> Tokenizer:
        """The `tokenizers` object itself (its vocabulary and JSON, for grammar compilation)."""
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size()

    def token_id(self, token: str | None) -> int | None:
        return None if token is None else self._tokenizer.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=True)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text for a conversation, ending where the assistant's reply begins; with
        add_generation_prompt=False, where the conversation ends (what a reward model scores)."""
        if not self.chat_template:
            raise ValueError("this model has no chat template; pass prompts as text or token ids")
        try:
            return _compile(self.chat_template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                       bos_token=self.bos_token or "", eos_token=self.eos_token or "")
        except Exception as error:      # a template is code from the model folder: any failure is the row's
            raise ValueError(f"chat template failed: {error}") from error


@lru_cache(maxsize=8)
def _compile(template: str):
    # As transformers renders them: sandboxed, trimmed blocks, raise_exception available.
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = _raise
    return environment.from_string(template)


def _raise(message: str) -> None:
    raise TemplateError(message)


def _token_text(token: str | dict | None) -> str | None:
    return token.get("content") if isinstance(token, dict) else token


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}
