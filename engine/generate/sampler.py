"""Sampler: one token per row from its logits, by that row's SamplingParams."""

from __future__ import annotations

import torch

from engine.generate.grammar import apply_grammar_masks
from engine.generate.request import Request


class Sampler:
    """Greedy rows take the argmax; the others are drawn with the exponential race
    (argmax of p / Exp(1)), one draw per row from the request's own generator when it
    has a seed, so a row's tokens do not depend on what else shares its batch."""

    def __init__(self, seed: int | None = None):
        self.generator = torch.Generator()     # unseeded requests share this one
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> tuple[list[int], list[dict | None]]:
        """logits float32 [num_rows, vocab] -> token per row, and {token: logprob} per row when asked."""
        if not requests:
            return [], []
        # Before everything else, so that greedy, sampled and logprob rows all see the grammar.
        apply_grammar_masks(logits, [request.grammar for request in requests])
        token_ids = logits.argmax(dim=-1)
        random_rows = [row for row, request in enumerate(requests) if not request.params.is_greedy]
        if random_rows:
            token_ids[random_rows] = self._draw(logits[random_rows], [requests[row] for row in random_rows])
        chosen = token_ids.tolist()
        logprobs = [None] * len(requests)
        asking = [row for row, request in enumerate(requests) if request.params.logprobs is not None]
        if asking:
            num_top = max(requests[row].params.logprobs for row in asking)
            scored = top_logprobs(logits[asking], [chosen[row] for row in asking], num_top)
            for row, entry in zip(asking, scored):
                logprobs[row] = _keep_top(entry, chosen[row], requests[row].params.logprobs)
        return chosen, logprobs

    def _draw(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        temperatures = torch.tensor([r.params.temperature for r in requests], dtype=logits.dtype, device=logits.device)
        logits = logits / temperatures[:, None]
        if any(r.params.top_k is not None or r.params.top_p < 1.0 for r in requests):
            logits = _top_k_top_p(logits, requests)
        probs = logits.softmax(dim=-1)
        # Drawn on CPU from CPU generators wherever the model runs: a seed means the same tokens everywhere.
        noise = torch.empty(probs.shape)
        for row, request in enumerate(requests):
            noise[row].exponential_(generator=request.generator or self.generator)
        return (probs / noise.to(probs.device)).argmax(dim=-1)


def _top_k_top_p(logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
    """Mask to -inf everything outside each row's top-k and top-p nucleus."""
    vocab = logits.shape[-1]
    top_k = torch.tensor([min(r.params.top_k or vocab, vocab) for r in requests], device=logits.device)
    top_p = torch.tensor([r.params.top_p for r in requests], dtype=logits.dtype, device=logits.device)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    outside = ranks >= top_k[:, None]
    probs = sorted_logits.masked_fill(outside, float("-inf")).softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs      # the likeliest token is always kept
    outside |= mass_before >= top_p[:, None]
    return logits.scatter(-1, order, sorted_logits.masked_fill(outside, float("-inf")))


def top_logprobs(logits: torch.Tensor, chosen: list[int], num_top: int) -> list[dict[int, float]]:
    """Per row: the chosen token's log-probability under the model, plus the num_top likeliest."""
    logprobs = logits.float().log_softmax(dim=-1)
    chosen_logprobs = logprobs.gather(-1, torch.tensor(chosen, device=logits.device)[:, None]).squeeze(-1).tolist()
    top_values, top_ids = logprobs.topk(num_top, dim=-1) if num_top else (None, None)
    entries = []
    for row, token_id in enumerate(chosen):
        entry = dict(zip(top_ids[row].tolist(), top_values[row].tolist())) if num_top else {}
        entry[token_id] = chosen_logprobs[row]
        entries.append(entry)
    return entries


def _keep_top(entry: dict[int, float], chosen: int, num_top: int) -> dict[int, float]:
    # As vLLM: the top num_top, plus the chosen token when it is not among them.
    top = sorted(entry, key=entry.get, reverse=True)[:num_top]
    return {chosen: entry[chosen], **{t: entry[t] for t in top}}
