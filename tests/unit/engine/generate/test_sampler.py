"""The vectorised sampler on fabricated logits: greedy rows and logprobs as the per-row sampler
gave them, seeded rows reproducible and independent of their batch, and draws that follow
softmax(logits / T) inside top-k / top-p."""

import math

import pytest
import torch

from engine.generate.request import Request
from engine.generate.sampler import Sampler, _mix32, inverse_cdf, row_key, row_uniforms
from engine.generate.sampling_params import SamplingParams

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_request(request_id: int, num_outputs: int = 0, **params) -> Request:
    request = Request(request_id, [1, 2, 3], SamplingParams(**params))
    request.token_ids += [7] * num_outputs      # the output position is what the noise depends on
    return request


def random_logits(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return (torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3).to(DEVICE)


def reference_logprobs(logits: torch.Tensor, chosen: list[int], num_top: int) -> list[dict[int, float]]:
    """The per-row sampler's figures (before vectorising), kept as the parity reference."""
    logprobs = logits.float().log_softmax(dim=-1)
    chosen_logprobs = logprobs.gather(-1, torch.tensor(chosen, device=logits.device)[:, None]).squeeze(-1).tolist()
    top_values, top_ids = logprobs.topk(num_top, dim=-1)
    entries = []
    for row, token_id in enumerate(chosen):
        entry = dict(zip(top_ids[row].tolist(), top_values[row].tolist()))
        entry[token_id] = chosen_logprobs[row]
        entries.append(entry)
    return entries


def test_greedy_rows_and_their_logprobs_are_the_argmax_and_the_exact_figures():
    logits = random_logits(5, 300)
    requests = [make_request(i, temperature=0.0, logprobs=[None, 0, 2, 5, 3][i]) for i in range(5)]
    ids, logprobs = Sampler(seed=0)(logits.clone(), requests)
    assert ids == logits.argmax(-1).tolist()
    expected = reference_logprobs(logits, ids, 5)
    assert logprobs[0] is None and logprobs[1] == {ids[1]: expected[1][ids[1]]}
    for row, num_top in ((2, 2), (3, 5), (4, 3)):
        top = sorted(expected[row], key=expected[row].get, reverse=True)[:num_top]
        assert logprobs[row] == {t: expected[row][t] for t in top}      # equal floats, not close ones


def test_a_greedy_row_beside_random_rows_is_still_the_argmax():
    logits = random_logits(4, 500, seed=1)
    requests = [make_request(0, temperature=0.0), make_request(1, temperature=1.3, top_p=0.5),
                make_request(2, temperature=0.0, logprobs=1), make_request(3, temperature=0.7, top_k=3, seed=4)]
    ids, _ = Sampler(seed=0)(logits.clone(), requests)
    argmax = logits.argmax(-1).tolist()
    assert (ids[0], ids[2]) == (argmax[0], argmax[2])


def test_a_seeded_row_gives_the_same_token_alone_in_any_batch_and_under_any_engine_seed():
    logits = random_logits(6, 4000, seed=2)
    seeded = dict(temperature=1.0, top_k=200, top_p=0.95, seed=123)
    alone = [Sampler(seed=0)(logits[2:3].clone(), [make_request(9, position, **seeded)])[0][0] for position in range(8)]
    for position in range(8):
        neighbours = [make_request(i, position + i, temperature=0.5 + i / 4, top_p=1.0 if i % 2 else 0.8)
                      for i in range(6)]
        neighbours[2] = make_request(40, position, **seeded)
        ids, _ = Sampler(seed=77)(logits.clone(), neighbours)
        assert ids[2] == alone[position]
    other_seed = [Sampler(seed=0)(logits[2:3].clone(), [make_request(9, position, **{**seeded, "seed": 124})])[0][0]
                  for position in range(8)]
    assert other_seed != alone


def test_unseeded_rows_follow_the_engine_seed_and_their_request_id():
    logits = random_logits(1, 4000, seed=3).expand(16, -1).contiguous()
    requests = [make_request(i, 5, temperature=1.0) for i in range(16)]
    first, again, reseeded = (Sampler(seed=s)(logits.clone(), requests)[0] for s in (5, 5, 6))
    assert first == again and first != reseeded
    assert len(set(first)) > 8      # sixteen requests over a flat-ish 4,000-token row do not share one stream


def test_the_noise_stream_is_fixed():
    """The bits a seed stands for, pinned: a change to the hash changes every seeded output."""
    bits = [_mix32(value) for value in (0, 1, 2, 0xFFFFFFFF, 123456789)]
    assert bits == [0, 0x31251BA7, 0x66A79298, 0x2028884F, 0x745E4774]     # as the C reference (uint32)
    words = torch.tensor([0, 1, 12345, 0xFFFFFFFF], device=DEVICE)
    uniforms = row_uniforms(words, words.flip(0), words)
    assert uniforms.dtype == torch.float64 and ((uniforms > 0) & (uniforms < 1)).all()
    assert torch.equal(uniforms.cpu(), row_uniforms(words.cpu(), words.flip(0).cpu(), words.cpu()))
    flat = torch.zeros(4, 1000, device=DEVICE)      # every token equally likely: the noise alone decides
    assert Sampler(seed=0)(flat, [make_request(0, position, seed=1) for position in range(4)])[0] == [443, 434, 539, 229]


def test_seeds_of_any_size_and_unseeded_requests_name_distinct_streams():
    seeds = (0, 1, 2 ** 32, 2 ** 32 + 1, 2 ** 64, 2 ** 100)
    keys = [row_key(make_request(0, seed=seed), engine_seed=0) for seed in seeds]
    keys += [row_key(make_request(request_id), engine_seed=0) for request_id in (0, 1, 2 ** 32)]
    keys.append(row_key(make_request(0), engine_seed=1))
    assert len(set(keys)) == len(keys) and all(0 <= word <= 0xFFFFFFFF for key in keys for word in key)


def _frequencies(ids: list[int], vocab: int) -> torch.Tensor:
    return torch.bincount(torch.tensor(ids), minlength=vocab).double() / len(ids)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_draws_follow_the_softmax_of_the_scaled_logits(temperature):
    """20,000 draws of one row (each at its own output position): every token's frequency
    within 5 standard errors of softmax(logits / T)."""
    num_draws, logits = 20_000, torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]], device=DEVICE)
    requests = [make_request(0, position, temperature=temperature, seed=11) for position in range(num_draws)]
    ids, _ = Sampler(seed=0)(logits.expand(num_draws, -1).clone(), requests)
    expected = (logits[0].double().cpu() / temperature).softmax(-1)
    bound = 5 * (expected * (1 - expected) / num_draws).sqrt() + 1e-4
    assert ((_frequencies(ids, 6) - expected).abs() <= bound).all()


def test_the_noise_is_uniform_across_the_vocabulary():
    """Equal logits over 256 tokens: a chi-square over 25,600 draws stays far below what a
    biased hash gives (255 degrees of freedom: mean 255, sd 22.6; the bound is 6 sd out)."""
    num_draws, vocab = 25_600, 256
    requests = [make_request(i, i % 7) for i in range(num_draws)]
    ids, _ = Sampler(seed=3)(torch.zeros(num_draws, vocab, device=DEVICE), requests)
    counts = torch.bincount(torch.tensor(ids), minlength=vocab).double()
    expected = num_draws / vocab
    assert ((counts - expected) ** 2 / expected).sum() < 255 + 6 * math.sqrt(2 * 255)


def test_top_k_and_top_p_never_emit_outside_their_set_and_cover_it():
    num_draws = 4000
    logits = torch.tensor([[3.0, 2.5, 2.0, 1.0, 0.0, -1.0, -2.0, -4.0]], device=DEVICE)
    probs = logits[0].cpu().double().softmax(-1)        # 0.50, 0.30, 0.18, ... : top_p 0.8 keeps the first 2 or 3
    nucleus = int((probs.cumsum(-1) - probs < 0.8).sum())
    for params, allowed in ((dict(top_k=3), set(range(3))), (dict(top_p=0.8), set(range(nucleus))),
                            (dict(top_k=2, top_p=0.99), {0, 1})):
        requests = [make_request(0, position, temperature=1.5, seed=2, **params) for position in range(num_draws)]
        ids, _ = Sampler(seed=0)(logits.expand(num_draws, -1).clone(), requests)
        assert set(ids) == allowed, params


def test_a_sampled_row_reports_its_drawn_token_in_its_logprobs():
    logits = random_logits(3, 100, seed=5)
    requests = [make_request(i, temperature=2.0, seed=i, logprobs=2) for i in range(3)]
    ids, logprobs = Sampler(seed=0)(logits.clone(), requests)
    full = logits.log_softmax(-1)
    for row, (token_id, entry) in enumerate(zip(ids, logprobs)):
        assert token_id in entry and entry[token_id] == full[row, token_id].item()
        assert len(entry) in (2, 3)


def test_the_inverse_cdf_lands_on_unmasked_tokens_at_both_ends_of_the_unit_interval():
    inf = float("inf")
    logits = torch.tensor([[-inf, 0.0, 0.0, -inf, 1.0, -inf]] * 4, device=DEVICE)
    uniforms = torch.tensor([2.0 ** -53, 0.3, 0.5, 1 - 2.0 ** -52], dtype=torch.float64, device=DEVICE)
    assert inverse_cdf(logits, uniforms).tolist() == [1, 2, 4, 4]
