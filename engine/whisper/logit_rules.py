"""Which tokens may come next: openai-whisper's logit filters, in its order.

SuppressBlank (no blank or end as the first token), SuppressTokens (non-speech symbols
and special tokens never), ApplyTimestampRules (timestamps in pairs and never going
back, a timestamp first, no more than max_initial_timestamp into the chunk, and a
timestamp whenever timestamps together outweigh the likeliest text token). Greedy
parity with the reference depends on applying exactly these, so the code mirrors it.
"""

from __future__ import annotations

import torch

from engine.whisper.config import SECONDS_PER_TIMESTAMP
from engine.whisper.tokenizer import WhisperTokenizer

NEG_INF = float("-inf")


class LogitRules:
    def __init__(self, tokenizer: WhisperTokenizer, suppress_ids: tuple[int, ...], suppress_ids_begin: tuple[int, ...]):
        self.tokenizer = tokenizer
        self.suppress_ids = torch.tensor(sorted(set(suppress_ids)), dtype=torch.long)
        self.suppress_ids_begin = torch.tensor(sorted(set(suppress_ids_begin)), dtype=torch.long)
        self._ids_on_device: dict[tuple[str, torch.device], torch.Tensor] = {}

    def apply(self, logits: torch.Tensor, outputs: list[list[int]], with_timestamps: list[bool],
              max_initial_timestamp: list[int]) -> None:
        """In place, on logits [n, vocab] whose row k continues outputs[k] (sampled tokens).

        NOTE: the rows' last rule (timestamps when they outweigh text) is decided for all
        rows at once, one read of the device per step rather than one per row."""
        for k, sampled in enumerate(outputs):
            if not sampled:
                logits[k, self._on("suppress_ids_begin", logits)] = NEG_INF
        logits[:, self._on("suppress_ids", logits)] = NEG_INF
        rows = [k for k, sampled in enumerate(outputs) if with_timestamps[k]]
        for k in rows:
            self._timestamp_rules(logits[k], outputs[k], max_initial_timestamp[k])
        if rows:
            self._timestamps_when_likelier(logits, rows)

    def _on(self, name: str, logits: torch.Tensor) -> torch.Tensor:
        """An id list (suppress_ids, suppress_ids_begin) on the logits' device, copied there once."""
        key = (name, logits.device)
        if key not in self._ids_on_device:
            self._ids_on_device[key] = getattr(self, name).to(logits.device)
        return self._ids_on_device[key]

    def _timestamps_when_likelier(self, logits: torch.Tensor, rows: list[int]) -> None:
        """A timestamp whenever the timestamps together outweigh the likeliest text token."""
        begin = self.tokenizer.timestamp_begin
        logprobs = torch.log_softmax(logits[rows].float(), dim=-1)
        likelier = (logprobs[:, begin:].logsumexp(dim=-1) > logprobs[:, :begin].max(dim=-1).values).tolist()
        for k, is_likelier in zip(rows, likelier):
            if is_likelier:
                logits[k, :begin] = NEG_INF

    def _timestamp_rules(self, row: torch.Tensor, sampled: list[int], max_initial_index: int) -> None:
        """Every rule but the last (_timestamps_when_likelier), in place on one row."""
        begin, eot = self.tokenizer.timestamp_begin, self.tokenizer.eot
        row[self.tokenizer.no_timestamps] = NEG_INF
        last_was_timestamp = len(sampled) >= 1 and sampled[-1] >= begin
        penultimate_was_timestamp = len(sampled) < 2 or sampled[-2] >= begin
        if last_was_timestamp:
            if penultimate_was_timestamp:    # a pair just closed: text must follow
                row[begin:] = NEG_INF
            else:                            # a pair is open: no text until it closes
                row[:eot] = NEG_INF
        timestamps = [t for t in sampled if t >= begin]
        if timestamps:
            # never back in time, and each segment at least one step long (no loops)
            last = timestamps[-1] if last_was_timestamp and not penultimate_was_timestamp else timestamps[-1] + 1
            row[begin:last] = NEG_INF
        if not sampled:
            row[:begin] = NEG_INF
            row[begin + max_initial_index + 1:] = NEG_INF


def compression_ratio(text: str) -> float:
    """How well the text gzips; looping hallucinations ("the the the ...") compress well."""
    import zlib
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def max_initial_timestamp_index(seconds: float) -> int:
    return round(seconds / SECONDS_PER_TIMESTAMP)
