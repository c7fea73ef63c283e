"""A request's logprobs with each token's bytes: what OpenAI's `logprobs` answer needs.

A token's bytes come from the vocabulary as xgrammar decodes it (byte-level BPE, byte
fallback and raw vocabularies alike), not from decoding the token alone: a token may be
half of a UTF-8 character, and its text alone would be U+FFFD. The table is built once per
engine, the first time a request asks for logprobs (about two seconds for a 49k vocabulary).
"""

from __future__ import annotations

from engine.generate.outputs import TokenLogprob
from engine.generate.tokenizer import TextTokenizer


class TokenPieces:
    def __init__(self, tokenizer: TextTokenizer, vocab_size: int, stop_token_ids: frozenset[int]):
        self._tokenizer, self._vocab_size, self._stop_token_ids = tokenizer, vocab_size, stop_token_ids
        self._pieces: list[bytes] | None = None

    def __getitem__(self, token_id: int) -> bytes:
        if self._pieces is None:
            from engine.generate.grammar import tokenizer_info
            info = tokenizer_info(self._tokenizer, self._vocab_size, self._stop_token_ids)
            self._pieces = list(info.decoded_vocab)
        return self._pieces[token_id] if token_id < len(self._pieces) else b""


def token_logprobs(entries: list[dict[int, float]], token_ids: list[int], num_top: int,
                   pieces: TokenPieces, ending_token_ids: frozenset[int] = frozenset()) -> list[TokenLogprob]:
    """`entries` (the sampler's {token: logprob} per generated token: the chosen token and
    the num_top likeliest) as TokenLogprobs; a token appended without a forward step has no
    entry and is left out (logprob requests are never jumped, so none is). A last token in
    `ending_token_ids` (the EOS or stop token that ended the request) is left out too: it is
    not part of the text, and OpenAI's logprobs do not list it."""
    if token_ids and token_ids[-1] in ending_token_ids:
        token_ids = token_ids[:-1]
    rendered = []
    for token_id, entry in zip(token_ids, entries):
        top = sorted(entry.items(), key=lambda item: item[1], reverse=True)[:num_top]
        rendered.append(TokenLogprob(token_id, pieces[token_id], entry[token_id],
                                     tuple(TokenLogprob(t, pieces[t], logprob) for t, logprob in top)))
    return rendered
