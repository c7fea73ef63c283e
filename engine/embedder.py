"""Embedder: the embed mode — tokenize, pack by length, encode, pool, back in input order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from engine.batching import plan_batches
from engine.config import EncoderConfig, load_encoder_config
from engine.layers.pooling import finish, pool
from engine.loader.safetensors import load_weights, weight_files
from engine.models.bert import BertModel, checkpoint_name_to_ours
from engine.outputs import EmbeddingOutput
from engine.tokenizer import Tokenizer


class Embedder:
    def __init__(self, config: EncoderConfig, tokenizer: Tokenizer, model: BertModel,
                 device: torch.device, max_batch_tokens: int):
        self.config = config
        self.tokenizer = tokenizer
        self.model = model
        self.device = device
        self.max_batch_tokens = max_batch_tokens

    @classmethod
    def load(cls, folder: str | Path, dtype: torch.dtype, device: torch.device,
             max_batch_tokens: int = 16384) -> "Embedder":
        config = load_encoder_config(folder)
        weight_files(folder)              # a missing weights file fails before anything is built
        tokenizer = Tokenizer.from_folder(folder, config.max_seq_length, config.do_lower_case)
        with torch.device("meta"):
            model = BertModel(config)
        load_weights(model, folder, checkpoint_name_to_ours)
        model = model.to(device=device, dtype=dtype).eval()
        return cls(config, tokenizer, model, device, max_batch_tokens)

    @property
    def embedding_dim(self) -> int:
        return self.config.hidden_size

    def embed(self, texts: list, dimensions: int | None = None, normalize: bool = True) -> np.ndarray:
        """float32 [len(texts), dimensions or embedding_dim]; raises on the first bad row."""
        for index, text in enumerate(texts):
            error = text_error(text)
            if error:
                raise ValueError(f"row {index}: {error}")
        outputs = self.encode(texts, dimensions, normalize)
        if not outputs:
            return np.zeros((0, dimensions or self.embedding_dim), dtype=np.float32)
        return np.stack([output.embedding for output in outputs])

    def encode(self, texts: list, dimensions: int | None = None, normalize: bool = True) -> list[EmbeddingOutput]:
        """One EmbeddingOutput per text, in input order; a bad row gets .error, never an exception."""
        self._check_dimensions(dimensions)
        errors = [text_error(text) for text in texts]
        valid = [index for index, error in enumerate(errors) if error is None]
        token_ids = self.tokenizer.encode_batch([texts[index] for index in valid])
        vectors = self._embed_token_ids(token_ids, dimensions, normalize)
        outputs = [EmbeddingOutput(None, 0, error) for error in errors]
        for position, index in enumerate(valid):
            outputs[index] = EmbeddingOutput(vectors[position], len(token_ids[position]))
        return outputs

    @torch.inference_mode()
    def _embed_token_ids(self, token_ids: list[list[int]], dimensions: int | None, normalize: bool) -> np.ndarray:
        vectors = np.zeros((len(token_ids), dimensions or self.embedding_dim), dtype=np.float32)
        for batch in plan_batches([len(ids) for ids in token_ids], self.max_batch_tokens):
            input_ids, attention_mask = self._pad([token_ids[index] for index in batch])
            hidden = self.model(input_ids, attention_mask)
            pooled = finish(pool(hidden, attention_mask, self.config.pooling), dimensions, normalize)
            vectors[batch] = pooled.cpu().numpy()
        return vectors

    def _pad(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-pad to the longest row: input_ids and attention_mask, both [len(rows), max_len]."""
        max_len = max(len(ids) for ids in rows)
        input_ids = torch.full((len(rows), max_len), self.config.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), max_len), dtype=torch.long)
        for row, ids in enumerate(rows):
            input_ids[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, :len(ids)] = 1
        return input_ids.to(self.device), attention_mask.to(self.device)

    def _check_dimensions(self, dimensions: int | None) -> None:
        if dimensions is None:
            return
        if isinstance(dimensions, bool) or not isinstance(dimensions, int) or not 0 < dimensions <= self.embedding_dim:
            raise ValueError(f"dimensions must be an int in 1..{self.embedding_dim} (the model's hidden size), got {dimensions!r}")


def text_error(text: object) -> str | None:
    """Why a row cannot be embedded, or None when it can."""
    if text is None:
        return "text is null"
    if not isinstance(text, str):
        return f"text is not a string (got {type(text).__name__})"
    return None
