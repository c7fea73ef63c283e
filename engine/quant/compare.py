"""The FP8 quality check on given rows: the same rows through an unquantized engine and
an FP8 one of the same model, and how far apart the results are.

    embed       cosine similarity of each row's two embeddings: mean and minimum
    generate    greedy agreement on the rows' prompts, and the perplexity of both models
                on the prompts' own tokens
    transcribe  word error rate of the FP8 transcript against the unquantized one: mean, max

`barge eval-quant` (engine.quant.evaluate) runs it on sample sentences; a job with
quant_check_rows runs it on the first rows of its shard 0 (queueing.quant_check). A row
that either engine refuses (a null text, undecodable audio) is left out of the figures.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

import numpy as np

from engine.token_ids import common_prefix

GREEDY_MAX_TOKENS = 32      # tokens generated per prompt for greedy agreement


@dataclass(frozen=True)
class QuantCheck:
    mode: str                           # "embed" | "generate" | "transcribe"
    quantization: str                   # what the FP8 engine ran: "fp8" | "fp8-block"
    baseline_dtype: str                 # the unquantized engine's dtype, e.g. "float32"
    num_rows: int                       # rows compared (both engines ran them without error)
    cosine_mean: float | None = None    # embed
    cosine_min: float | None = None     # embed
    greedy_agreement: float | None = None   # generate: tokens equal before the first divergence / all
    greedy_exact: float | None = None       # generate: prompts whose whole greedy output is identical
    num_tokens: int | None = None           # generate: prompt tokens scored for perplexity
    perplexity_baseline: float | None = None
    perplexity_fp8: float | None = None
    wer_mean: float | None = None       # transcribe: FP8 transcript against the unquantized one
    wer_max: float | None = None
    recipe: str | None = None           # how Barge quantized: scale method and what its recipe keeps 16-bit
    kept_16bit: str | None = None       # the block linears the FP8 model actually left 16-bit

    def to_dict(self) -> dict:
        return {name: value for name, value in asdict(self).items() if value is not None}


def compare(baseline, fp8, rows: list, params: dict) -> QuantCheck:
    """Run `rows` through both engines (engine.Engine, one mode) with a job's params."""
    settings = fp8.settings
    head = dict(mode=fp8.mode, quantization=settings["quantization"], baseline_dtype=baseline.settings["dtype"],
                **recipe_fields(fp8))
    if fp8.mode == "embed":
        return QuantCheck(**head, **compare_embeddings(baseline, fp8, rows, params))
    if fp8.mode == "generate":
        max_tokens = min(params.get("max_tokens", GREEDY_MAX_TOKENS), GREEDY_MAX_TOKENS)
        return QuantCheck(**head, **compare_generations(baseline, fp8, rows, max_tokens))
    return QuantCheck(**head, **compare_transcripts(baseline, fp8, rows, params))


def recipe_fields(fp8) -> dict:
    """recipe and kept_16bit for an FP8 engine: the recipe quantization= applies at load,
    and the block linears its model kept 16-bit (when the engine shows its model)."""
    from engine.quant.config import fp8_config_from_name
    from engine.quant.recipe import describe_kept, describe_recipe, kept_linears, model_of
    quantization = fp8.settings.get("quantization")
    fields = {}
    if quantization in ("fp8", "fp8-block", "fp8-group"):
        fields["recipe"] = describe_recipe(fp8_config_from_name(quantization))
    model = model_of(fp8)
    if model is not None:
        fields["kept_16bit"] = describe_kept(kept_linears(model))
    return fields


def compare_embeddings(baseline, fp8, texts: list, params: dict) -> dict:
    theirs, ours = baseline.encode(texts, **params), fp8.encode(texts, **params)
    pairs = [(a.embedding, b.embedding) for a, b in zip(theirs, ours) if a.is_ok and b.is_ok]
    if not pairs:
        raise ValueError("no row embedded without error: nothing to compare")
    a = np.stack([pair[0] for pair in pairs]).astype(np.float64)
    b = np.stack([pair[1] for pair in pairs]).astype(np.float64)
    cosines = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return dict(num_rows=len(pairs), cosine_mean=float(cosines.mean()), cosine_min=float(cosines.min()))


def compare_generations(baseline, fp8, prompts: list, max_tokens: int) -> dict:
    from engine.generate import SamplingParams
    ids = [baseline.llm.prompt_token_ids(prompt) for prompt in prompts]
    ids = [row for row in ids if not isinstance(row, str)]
    if not ids:
        raise ValueError("no prompt could be tokenized: nothing to compare")
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    theirs, ours = baseline.generate(ids, params), fp8.generate(ids, params)
    pairs = [(a.token_ids, b.token_ids) for a, b in zip(theirs, ours) if a.is_ok and b.is_ok]
    if not pairs:
        raise ValueError("no prompt generated without error: nothing to compare")
    agreed = sum(common_prefix(a, b) for a, b in pairs)
    num_tokens, nll_baseline = negative_log_likelihood(baseline, ids)
    _, nll_fp8 = negative_log_likelihood(fp8, ids)
    return dict(num_rows=len(pairs), greedy_agreement=agreed / max(1, sum(len(a) for a, _ in pairs)),
                greedy_exact=sum(a == b for a, b in pairs) / len(pairs), num_tokens=num_tokens,
                perplexity_baseline=math.exp(nll_baseline / num_tokens), perplexity_fp8=math.exp(nll_fp8 / num_tokens))


def negative_log_likelihood(engine, prompts: list[list[int]]) -> tuple[int, float]:
    """(tokens scored, their summed negative log-likelihood): each prompt's ids[1:], each
    given the tokens before it. Prompts the engine refuses are skipped."""
    from engine.generate import SamplingParams
    outputs = engine.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0))
    num_tokens, total, errors = 0, 0.0, []
    for ids, output in zip(prompts, outputs):
        if output.error or len(ids) < 2:
            errors.append(output.error or f"{len(ids)} token")
            continue
        total -= sum(entry[token] for entry, token in zip(output.prompt_logprobs[1:], ids[1:]))
        num_tokens += len(ids) - 1
    if num_tokens == 0:
        raise ValueError(f"cannot score any prompt ({errors[0] if errors else 'none given'}); "
                         "perplexity needs prompts of two tokens or more")
    return num_tokens, total


def compare_transcripts(baseline, fp8, audio: list, params: dict) -> dict:
    theirs, ours = baseline.transcribe(audio, **params), fp8.transcribe(audio, **params)
    rates = [word_error_rate(a.text, b.text) for a, b in zip(theirs, ours) if a.error is None and b.error is None]
    if not rates:
        raise ValueError("no row transcribed without error: nothing to compare")
    return dict(num_rows=len(rates), wer_mean=sum(rates) / len(rates), wer_max=max(rates))


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word-level Levenshtein distance over the reference's word count, case and
    punctuation ignored; two empty transcripts agree."""
    return edit_rate(_words(reference), _words(hypothesis))


def edit_rate(ref: list[str], hyp: list[str]) -> float:
    """Levenshtein distance between two word lists over the reference's length (its
    normalisation is the caller's)."""
    previous = list(range(len(hyp) + 1))
    for i, ref_word in enumerate(ref, 1):
        current = [i]
        for j, hyp_word in enumerate(hyp, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref_word != hyp_word)))
        previous = current
    return previous[-1] / max(1, len(ref))


def _words(text: str) -> list[str]:
    return re.findall(r"[\w']+", text.lower())
