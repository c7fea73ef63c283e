"""Sampler: one token per row from its logits, by that row's SamplingParams, vectorised over
the batch on the device the logits live on.

NOTE: the randomness is counter-based, not drawn from a generator. A random row is drawn by
inverting its CDF (the cumulative sum of softmax(logits / T) after top-k / top-p, in float64)
at one uniform number U per row, and U is a function of two integers only:

    key       64 bits folded from the request's seed (SamplingParams.seed), or, without
              one, from the engine's seed and the request's id (on the host, cached)
    position  the request's output position: how many output tokens it has so far

hashed to 52 bits with integer ops (`_mix32`: multiply, xor, shift, masked to 32 bits in
int64 so that nothing overflows) on the logits' device. U is therefore the same on CPU and
CUDA by construction, and a row's tokens depend on nothing its batch neighbours do: the
promise a seed makes ("the same tokens everywhere") kept without a per-row draw on the host.
What may still differ across devices is the rounding of the logits and of the softmax, which
moves a token's interval of the CDF by about 1e-7 of the mass.

Why one uniform per row and not noise per vocabulary entry (the exponential race the
per-request CPU generators drew): hashing [rows, vocab] integers costs a dozen passes over
the step's largest tensor, more than the softmax itself; the inverse CDF is a softmax, a
cumulative sum and a binary search. Streams drawn before this scheme are not reproduced: a
seed gives a new, but again fixed, stream.

Per step the host copies each row's parameters to the device once, and the device copies
back the sampled ids once, plus the logprob figures once when any row asks for them.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

import torch

from engine.generate.grammar import apply_grammar_masks
from engine.generate.request import Request

MASK32 = 0xFFFFFFFF
MIX_MULTIPLIER = 0x45D9F3B      # T. Mueller's 32-bit finaliser: < 2^27, so x * it stays below 2^59
UNIFORM_BITS = 52               # a float64 holds (k + 0.5) / 2^52 exactly, and it is never 0 nor 1
SEEDED, UNSEEDED = 1, 2         # domains: a seed never collides with an (engine seed, request id) pair


def _mix32(x):
    """A bijection of [0, 2^32) with full avalanche, on a Python int or an int64 tensor alike."""
    x = ((x >> 16) ^ x) * MIX_MULTIPLIER & MASK32
    x = ((x >> 16) ^ x) * MIX_MULTIPLIER & MASK32
    return (x >> 16) ^ x


def _fold(state: int, words: tuple[int, ...]) -> int:
    """Non-negative ints of any size -> 32 bits, each word's length folded in with it."""
    for word in words:
        chunks = [(word >> shift) & MASK32 for shift in range(0, max(word.bit_length(), 1), 32)]
        for chunk in (len(chunks), *chunks):
            state = _mix32(state ^ chunk)
    return state


@functools.lru_cache(maxsize=1 << 16)
def _stream_key(*words: int) -> tuple[int, int]:
    # 64 bits: two folds from different starts. 32 bits alone would let rows of a
    # million-row job share a stream (the birthday bound).
    return _fold(0x9E3779B9, words), _fold(0x85EBCA6B, words)


def row_key(request: Request, engine_seed: int) -> tuple[int, int]:
    """Two 32-bit words naming the request's random stream, the same wherever it runs."""
    if request.params.seed is not None:
        return _stream_key(SEEDED, request.params.seed)
    return _stream_key(UNSEEDED, engine_seed, request.request_id)


def row_uniforms(key_high: torch.Tensor, key_low: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """int64 [rows] each (the stream key's words, the output position) -> float64 [rows] in
    (0, 1): 52 hashed bits, so U is exact in float64 and never 0 nor 1."""
    position = _mix32(positions & MASK32)
    high = _mix32(key_high ^ position)
    low = _mix32(key_low ^ _mix32(position ^ 0x5BD1E995))
    bits = (high << (UNIFORM_BITS - 32)) | (low >> (64 - UNIFORM_BITS))
    return (bits.double() + 0.5) * 2.0 ** -UNIFORM_BITS


def inverse_cdf(logits: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The token whose interval of the CDF of softmax(logits) holds each row's U; a token of
    probability 0 (masked to -inf) has an empty interval and is never drawn."""
    cdf = logits.softmax(dim=-1).cumsum(dim=-1, dtype=torch.float64)
    total = cdf[:, -1:]
    # Below the total strictly, so that the search always lands on a token of nonzero mass.
    target = torch.minimum(uniforms[:, None] * total, total.nextafter(torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(-1)


@dataclass
class SamplingBatch:
    """The random rows' parameters on the logits' device, copied there in one transfer."""

    rows: torch.Tensor | None           # int64 [random]: their rows in the step's logits; None: all rows
    temperatures: torch.Tensor          # float32 [random, 1]
    keys: torch.Tensor                  # int64 [random, 2]: row_key of each
    positions: torch.Tensor             # int64 [random]: each one's output position
    filtered_rows: torch.Tensor | None  # int64 [filtered]: the random rows with top-k or top-p; None: all
    top_k: torch.Tensor | None          # int64 [filtered], vocab_size where unset; None: no row filters
    top_p: torch.Tensor | None          # float32 [filtered], 1 where unset

    @classmethod
    def build(cls, requests: list[Request], random_rows: list[int], engine_seed: int, vocab_size: int,
              device: torch.device) -> "SamplingBatch":
        sampled = [requests[row] for row in random_rows]
        filtered = [index for index, r in enumerate(sampled) if r.params.top_k is not None or r.params.top_p < 1.0]
        values = [v for row, r in zip(random_rows, sampled)
                  for v in (row, r.params.temperature, *row_key(r, engine_seed), r.num_output_tokens)]
        values += [v for index in filtered for v in (index, min(sampled[index].params.top_k or vocab_size, vocab_size),
                                                    sampled[index].params.top_p)]
        # float64 holds every value exactly (rows, sizes, 32-bit words); one host-to-device copy.
        flat = torch.tensor(values, dtype=torch.float64).to(device, non_blocking=True)
        table, filters = flat[:5 * len(sampled)].view(-1, 5), flat[5 * len(sampled):].view(-1, 3)
        return cls(rows=None if len(sampled) == len(requests) else table[:, 0].long(),
                   temperatures=table[:, 1:2].float(), keys=table[:, 2:4].long(), positions=table[:, 4].long(),
                   filtered_rows=None if len(filtered) == len(sampled) else filters[:, 0].long(),
                   top_k=filters[:, 1].long() if filtered else None, top_p=filters[:, 2].float() if filtered else None)


class Sampler:
    """Greedy rows take the argmax; the others are drawn at their counter-based uniform (see
    the NOTE above), so a row's tokens do not depend on what else shares its batch, nor on
    the device."""

    def __init__(self, seed: int | None = None):
        self.seed = random.getrandbits(64) if seed is None else seed    # for requests without their own

    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> tuple[list[int], list[dict | None]]:
        """logits float32 [num_rows, vocab] -> token per row, and {token: logprob} per row when asked."""
        if not requests:
            return [], []
        # Before everything else, so that greedy, sampled and logprob rows all see the grammar.
        apply_grammar_masks(logits, [request.grammar for request in requests])
        token_ids = self.sample(logits, requests)
        asking = [row for row, request in enumerate(requests) if request.params.logprobs is not None]
        scored = self._score(logits, token_ids, requests, asking) if asking else []
        chosen = token_ids.tolist()         # the step's one device-to-host copy of the ids
        logprobs = [None] * len(requests)
        for row, entry in zip(asking, scored):
            logprobs[row] = _keep_top(entry, chosen[row], requests[row].params.logprobs)
        return chosen, logprobs

    def sample(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        """int64 [num_rows] on the logits' device; nothing is copied back. Only the random
        rows are drawn, and only the rows with top-k / top-p are sorted."""
        random_rows = [row for row, request in enumerate(requests) if not request.params.is_greedy]
        if not random_rows:
            return logits.argmax(dim=-1)
        batch = SamplingBatch.build(requests, random_rows, self.seed, logits.shape[-1], logits.device)
        scaled = (logits if batch.rows is None else logits[batch.rows]) / batch.temperatures
        if batch.top_k is not None and batch.filtered_rows is None:
            scaled = top_k_top_p(scaled, batch.top_k, batch.top_p)
        elif batch.top_k is not None:
            scaled[batch.filtered_rows] = top_k_top_p(scaled[batch.filtered_rows], batch.top_k, batch.top_p)
        drawn = inverse_cdf(scaled, row_uniforms(batch.keys[:, 0], batch.keys[:, 1], batch.positions))
        if batch.rows is None:
            return drawn
        return logits.argmax(dim=-1).index_put_((batch.rows,), drawn)

    @staticmethod
    def _score(logits: torch.Tensor, token_ids: torch.Tensor, requests: list[Request],
               asking: list[int]) -> list[dict[int, float]]:
        num_top = max(requests[row].params.logprobs for row in asking)
        rows = torch.tensor(asking, device=logits.device)
        return top_logprobs(logits[rows], token_ids[rows], num_top)


def top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask to -inf everything outside each row's top-k and top-p nucleus; a row with top_k =
    vocab and top_p = 1 comes back unchanged, so it samples as it would alone."""
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    outside = ranks >= top_k[:, None]
    probs = sorted_logits.masked_fill(outside, float("-inf")).softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs      # the likeliest token is always kept
    # top_p < 1 only: a rounded cumulative sum may pass 1.0 in a row that asked for no nucleus.
    outside |= (mass_before >= top_p[:, None]) & (top_p[:, None] < 1.0)
    return logits.scatter(-1, order, sorted_logits.masked_fill(outside, float("-inf")))


def top_logprobs(logits: torch.Tensor, chosen: torch.Tensor | list[int], num_top: int) -> list[dict[int, float]]:
    """Per row: the chosen token's log-probability under the model, plus the num_top likeliest.
    The figures come back to the host in one copy."""
    logprobs = logits.float().log_softmax(dim=-1)
    chosen = torch.as_tensor(chosen, dtype=torch.int64, device=logits.device)
    columns = [chosen[:, None].double(), logprobs.gather(-1, chosen[:, None]).double()]
    if num_top:
        top_values, top_ids = logprobs.topk(num_top, dim=-1)
        columns += [top_ids.double(), top_values.double()]     # float64: token ids and float32 values exactly
    table = torch.cat(columns, dim=-1).cpu().tolist()
    entries = []
    for row in table:
        token_id, chosen_logprob = int(row[0]), row[1]
        entry = dict(zip(map(int, row[2:2 + num_top]), row[2 + num_top:])) if num_top else {}
        entry[token_id] = chosen_logprob
        entries.append(entry)
    return entries


def _keep_top(entry: dict[int, float], chosen: int, num_top: int) -> dict[int, float]:
    # As vLLM: the top num_top, plus the chosen token when it is not among them.
    top = sorted(entry, key=entry.get, reverse=True)[:num_top]
    return {chosen: entry[chosen], **{t: entry[t] for t in top}}
