"""Classifier: a *ForSequenceClassification model — classify rows (texts, pairs, or chats
for a reward model), or score (query, document) pairs as a cross-encoder.

    rows -> check -> tokenize ahead -> pack by length -> encoder + head -> logits -> labels / scores

Batching is the embedder's (engine/embed/embedder.py): rows sorted by length into batches
of at most max_batch_tokens real tokens, laid end to end with no padding, attention over
each text alone (engine/embed/batching.py); an out-of-memory batch is split under a halved
budget (engine.oom). A bad row becomes a result with .error, never an exception.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from engine.embed.batching import pack, plan_batches
from engine.embed.config import EncoderConfig
from engine.embed.embedder import CHUNK_ROWS, FIRST_CHUNK_ROWS
from engine.embed.tokenizer import tokenize_ahead
from engine.oom import OOM_ROW_ERROR, OomGuard
from engine.score.head_config import HeadConfig
from engine.score.labels import activate, classify_result
from engine.score.loader import load_classifier
from engine.score.outputs import ClassifyResult, ScoreOutput
from engine.score.params import ClassifyParams, ScoreParams
from engine.score.rows import Row, RowError, as_row, pair_error
from engine.score.tokenizer import Encoded, ScoreTokenizer
from engine.settings import encoder_settings
from engine.step_stats import StepObserver, StepStats, notify

Logits = np.ndarray     # [num_labels] float32, one row's


class Classifier:
    def __init__(self, config: EncoderConfig, head: HeadConfig, tokenizer: ScoreTokenizer, model: torch.nn.Module,
                 device: torch.device, max_batch_tokens: int):
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
        self.config, self.head, self.tokenizer, self.model = config, head, tokenizer, model
        self.device = device
        self.max_batch_tokens = max_batch_tokens
        self.step_observers: list[StepObserver] = []     # called with each forward batch's StepStats
        self.oom_guard = OomGuard.from_env()              # out-of-memory errors survived (engine.oom)
        self._tokenize_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="barge-tokenize")

    @classmethod
    def load(cls, folder: str | Path, dtype: torch.dtype, device: torch.device, max_batch_tokens: int,
             quantization: str | None = None) -> "Classifier":
        config, head, tokenizer, model = load_classifier(folder, dtype, device, max_batch_tokens, quantization)
        return cls(config, head, tokenizer, model, device, max_batch_tokens)

    @property
    def labels(self) -> tuple[str, ...]:
        return self.head.labels

    @property
    def settings(self) -> dict:
        return encoder_settings(self.model, self.max_batch_tokens, self.config.max_seq_length, self.oom_guard.num_ooms)

    def classify(self, rows: Sequence, params: ClassifyParams) -> list[ClassifyResult]:
        """One ClassifyResult per row, in input order. A row is a text, a (text, text_pair)
        pair (an NLI model's premise and hypothesis), or a chat (a list of {"role",
        "content"} messages, through the model's chat template: a reward model's input)."""
        outputs = self._logits([as_row(row) for row in rows], params.truncate)
        return [ClassifyResult(label=None, score=None, num_tokens=num_tokens, error=logits) if isinstance(logits, str)
                else classify_result(logits, self.head, params, num_tokens) for logits, num_tokens in outputs]

    def score_pairs(self, queries: Sequence, documents: Sequence, params: ScoreParams) -> list[ScoreOutput]:
        """A cross-encoder's score per pair, as sentence-transformers' CrossEncoder.predict
        computes it: the pair tokenized together, one logit, its activation
        (params.activation; "auto" is the folder's saved one, else sigmoid)."""
        if self.head.num_labels != 1:
            raise ValueError(f"scoring pairs needs a one-label classifier (a cross-encoder); this model has "
                             f"{self.head.num_labels} labels {list(self.head.labels)}: classify its pairs instead")
        activation = self.head.cross_encoder_activation if params.activation == "auto" else params.activation
        if len(queries) != len(documents):
            raise ValueError(f"{len(queries)} queries for {len(documents)} documents")
        rows = [RowError(error) if (error := pair_error(query, document)) else (query, document)
                for query, document in zip(queries, documents)]
        return [ScoreOutput(None, num_tokens, logits) if isinstance(logits, str)
                else ScoreOutput(float(activate(logits, activation)[0]), num_tokens)
                for logits, num_tokens in self._logits(rows, params.truncate)]

    def _logits(self, rows: list, truncate: bool) -> list[tuple[Logits | str, int]]:
        """(logits, or why the row has none; its number of tokens) per row, in input order."""
        outputs: list[tuple[Logits | str, int] | None] = [None] * len(rows)
        valid = []
        for index, row in enumerate(rows):
            if isinstance(row, RowError):
                outputs[index] = (row.error, 0)
            else:
                valid.append(index)
        for chunk, encoded in self._tokenized_chunks(rows, valid, truncate):
            accepted = []
            for index, tokens in zip(chunk, encoded):
                error = tokens if isinstance(tokens, str) else self._length_error(rows[index], len(tokens))
                if error:
                    outputs[index] = (error, 0 if isinstance(tokens, str) else len(tokens))
                else:
                    accepted.append((index, tokens))
            logits, errors = self._run([tokens for _, tokens in accepted])
            for position, (index, tokens) in enumerate(accepted):
                outputs[index] = (errors.get(position) or logits[position], len(tokens))
        return outputs

    def _tokenized_chunks(self, rows: list, valid: list[int], truncate: bool,
                          ) -> Iterator[tuple[list[int], list[Encoded | str]]]:
        """(row indices, their Encoded) chunk by chunk, the next chunks tokenizing on a
        background thread while the model runs (engine.embed.tokenizer.tokenize_ahead)."""
        bounds = [0, min(FIRST_CHUNK_ROWS, len(valid))]
        while bounds[-1] < len(valid):
            bounds.append(min(bounds[-1] + CHUNK_ROWS, len(valid)))
        chunks = [valid[start:end] for start, end in zip(bounds, bounds[1:]) if end > start]
        encoded = tokenize_ahead(self.tokenizer, ([rows[index] for index in chunk] for chunk in chunks), truncate,
                                 self._tokenize_pool, depth=2)
        yield from zip(chunks, encoded)

    def _length_error(self, row: Row, num_tokens: int) -> str | None:
        limit = self.config.max_seq_length
        kind = "chat" if isinstance(row, list) else "pair" if isinstance(row, tuple) else "text"
        if num_tokens > limit:
            refused = "" if kind == "chat" else " (refused because truncate=False)"
            return f"{kind} has {num_tokens} tokens, over the model's max_seq_length of {limit}{refused}"
        return f"{kind} has no tokens" if num_tokens == 0 else None

    @torch.inference_mode()
    def _run(self, encoded: list[Encoded]) -> tuple[np.ndarray, dict[int, str]]:
        """Logits [len(encoded), num_labels], and the rows that ran out of memory alone (row -> error)."""
        logits = np.zeros((len(encoded), self.head.num_labels), dtype=np.float32)
        errors: dict[int, str] = {}
        token_ids = [tokens.token_ids for tokens in encoded]
        lengths = [len(ids) for ids in token_ids]
        pending = plan_batches(lengths, self.max_batch_tokens)
        while pending:
            rows = pending.pop(0)
            try:
                logits[rows] = self._forward(token_ids, _type_ids(encoded, rows), rows)
            except torch.OutOfMemoryError as error:
                self._after_oom(error, rows, lengths, errors)
                # Every batch still to run is planned again under the lowered budget.
                remaining = [row for batch in [rows, *pending] for row in batch if row not in errors]
                pending = [[remaining[i] for i in part]
                           for part in plan_batches([lengths[row] for row in remaining], self.max_batch_tokens)]
        return logits, errors

    def _forward(self, token_ids: list[list[int]], types: torch.Tensor | None, rows: list[int]) -> np.ndarray:
        """One batch's logits [len(rows), num_labels], in the order of `rows`; types: its
        tokens' segments in that order (None: all 0)."""
        batch = pack(token_ids, rows)
        if self.device.type == "cuda":
            batch = batch.pin().to(self.device, non_blocking=True)
            types = None if types is None else types.pin_memory().to(self.device, non_blocking=True)
        if self.step_observers:
            notify(self.step_observers, StepStats(num_seqs=len(rows), num_tokens=batch.num_tokens,
                                                  max_num_seqs=None, max_num_tokens=self.max_batch_tokens))
        self.oom_guard.check(batch.num_tokens)
        return self.model(batch, types).cpu().numpy()

    def _after_oom(self, error: BaseException, rows: list[int], lengths: list[int], errors: dict[int, str]) -> None:
        """As the embedder: halve the budget below the failed batch's tokens, or, for a row
        alone, make it an error row."""
        if len(rows) == 1:
            errors[rows[0]] = f"{OOM_ROW_ERROR} ({lengths[rows[0]]} tokens)"
            self.oom_guard.record(error, self.device, f"row of {lengths[rows[0]]} tokens made an error row")
            return
        self.max_batch_tokens = max(1, min(self.max_batch_tokens, sum(lengths[row] for row in rows)) // 2)
        self.oom_guard.record(error, self.device, f"max_batch_tokens lowered to {self.max_batch_tokens}")


def _type_ids(encoded: list[Encoded], rows: list[int]) -> torch.Tensor | None:
    """[num_tokens] each token's segment in packed order; None when every token is segment 0."""
    if all(encoded[row].type_ids is None for row in rows):
        return None
    return torch.tensor([segment for row in rows
                         for segment in (encoded[row].type_ids or [0] * len(encoded[row]))], dtype=torch.long)
