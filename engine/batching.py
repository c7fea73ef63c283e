"""Batch packing for encoders: a pure decision, table-tested in tests/unit/engine."""

from __future__ import annotations


def plan_batches(lengths: list[int], max_batch_tokens: int) -> list[list[int]]:
    """Group row indices into batches whose padded size fits the token budget.

    Rows are taken longest first, so each batch pads to its first row's length and
    holds rows of similar length: padded size = len(batch) * length of batch[0].
    A row longer than the whole budget still gets a batch of its own.
    """
    if max_batch_tokens < 1:
        raise ValueError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    batches: list[list[int]] = []
    for index in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= max_batch_tokens:
            batches[-1].append(index)
        else:
            batches.append([index])
    return batches
