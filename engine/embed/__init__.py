"""The embed mode: texts in, one vector per text out (Engine mode "embed").

    config.py      EncoderConfig: config.json and the sentence-transformers files beside it
    tokenizer.py   Tokenizer (never padding) and tokenize_ahead, the feed of token ids
    batching.py    PackedBatch: texts laid end to end, the encoders' forward batch
    params.py      EmbedParams: what a caller chooses per call, checked in one place
    embedder.py    Embedder: tokenize ahead → pack → encode → pool, back in input order
    outputs.py     EmbeddingOutput: one per text

The names below load on first use (PEP 562): the worker and the client build EmbedParams
(engine.embed.params, torch-free) without loading the model code and torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.lazy import lazy_names

_WHERE = {"EmbedParams": "engine.embed.params", "Embedder": "engine.embed.embedder",
          "EmbeddingOutput": "engine.embed.outputs"}

__all__ = ["EmbedParams", "Embedder", "EmbeddingOutput"]

if TYPE_CHECKING:
    from engine.embed.embedder import Embedder
    from engine.embed.outputs import EmbeddingOutput
    from engine.embed.params import EmbedParams


__getattr__ = lazy_names(__name__, _WHERE)
