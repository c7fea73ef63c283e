"""The FP8 quality check as a feature (`barge eval-quant MODEL`): the same model loaded twice,
16/32-bit and FP8, on the same sample.

    embed     cosine similarity of each text's two embeddings: mean and minimum
    generate  perplexity of both on one text, and greedy agreement on a set of prompts

The comparisons themselves are engine.quant.compare's, which a job's own check
(JobSpec.quant_check_rows) runs on the job's rows.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from engine.config import is_embedding_folder
from engine.engine import Engine
from engine.generate import SamplingParams
from engine.layers.fp8_linear import fp8_weight_bytes
from engine.quant.compare import common_prefix, compare_embeddings, negative_log_likelihood

LICENSES = Path("/usr/share/common-licenses")
SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+")
MIN_SENTENCE_CHARS, MAX_SENTENCE_CHARS = 20, 400


@dataclass(frozen=True)
class QuantEval:
    mode: str                           # "embed" | "generate"
    quantization: str                   # what the FP8 model ran: "fp8" | "fp8-block"
    baseline_dtype: str                 # the reference model's dtype, e.g. "float32"
    num_samples: int                    # texts embedded, or prompts generated from
    fp8_weight_bytes: int               # the FP8 layers' weights and scales, as stored
    bf16_weight_bytes: int              # the same weights in bf16
    cosine_mean: float | None = None    # embed
    cosine_min: float | None = None     # embed
    num_tokens: int | None = None       # generate: tokens scored for perplexity
    perplexity_baseline: float | None = None
    perplexity_fp8: float | None = None
    greedy_agreement: float | None = None   # generated tokens equal before the first divergence / all
    greedy_exact: float | None = None       # prompts whose whole greedy output is identical

    def format(self) -> str:
        lines = [f"{self.mode} model, {self.quantization} vs {self.baseline_dtype}, {self.num_samples} samples",
                 f"  FP8 layer weights: {self.fp8_weight_bytes / 2**20:.1f} MiB "
                 f"({self.fp8_weight_bytes / self.bf16_weight_bytes:.1%} of bf16's {self.bf16_weight_bytes / 2**20:.1f} MiB)"]
        if self.mode == "embed":
            lines.append(f"  embedding cosine: mean {self.cosine_mean:.5f}, min {self.cosine_min:.5f}")
        else:
            change = self.perplexity_fp8 / self.perplexity_baseline - 1
            lines.append(f"  perplexity over {self.num_tokens} tokens: {self.baseline_dtype} "
                         f"{self.perplexity_baseline:.3f}, fp8 {self.perplexity_fp8:.3f} ({change:+.2%})")
            lines.append(f"  greedy agreement: {self.greedy_agreement:.1%} of tokens, "
                         f"{self.greedy_exact:.1%} of prompts identical")
        return "\n".join(lines)


def sample_sentences(limit: int, folder: Path = LICENSES) -> list[str]:
    """Up to `limit` distinct sentences, taken in turn from each file so that they vary."""
    if not folder.is_dir():
        raise ValueError(f"no sample text folder {folder}; pass texts explicitly")
    per_file = []
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        text = " ".join(path.read_text(encoding="utf-8", errors="replace").split())
        per_file.append([s for s in SENTENCE_END.split(text) if MIN_SENTENCE_CHARS <= len(s) <= MAX_SENTENCE_CHARS])
    sentences, seen = [], set()
    for round_ in range(max(map(len, per_file), default=0)):
        for sentences_of_file in per_file:
            if round_ < len(sentences_of_file) and sentences_of_file[round_] not in seen:
                seen.add(sentences_of_file[round_])
                sentences.append(sentences_of_file[round_])
    return sentences[:limit]


def detect_mode(model: str | Path) -> str:
    path = Path(model)
    if path.suffix == ".gguf":
        return "generate"
    config = path / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"config.json not found in model folder {path}")
    return "embed" if is_embedding_folder(path) else "generate"


def evaluate(model: str | Path, quantization: str = "fp8", mode: str | None = None, texts: list[str] | None = None,
             dtype: str = "float32", num_samples: int = 500, num_tokens: int = 1024, max_tokens: int = 32,
             perplexity_text: str | None = None, **engine_options) -> QuantEval:
    """Load `model` in `dtype` and with `quantization`, and compare them (see the module doc).
    texts: the sample (default: sentences of /usr/share/common-licenses). For generate,
    perplexity is over the first num_tokens tokens of perplexity_text (default: the texts
    joined), and the first len(texts) // 10 texts are the greedy prompts."""
    if quantization not in ("fp8", "fp8-block"):
        raise ValueError(f"unsupported quantization {quantization!r}; expected 'fp8' or 'fp8-block'")
    mode = mode or detect_mode(model)
    if mode not in ("embed", "generate"):
        raise ValueError(f"eval-quant compares embed or generate models, not mode {mode!r}")
    texts = texts if texts is not None else sample_sentences(num_samples)
    if not texts:
        raise ValueError("no sample texts to evaluate on")
    if mode == "generate":
        # A KV cache for the longest request, twice over: the scheduler batches the rest into
        # it; the default (a share of free memory, per engine) would hold gigabytes twice.
        block_size = engine_options.get("block_size", 16)
        engine_options.setdefault("num_blocks", 2 * -(-(num_tokens + max_tokens + 1) // block_size) + 64)
    baseline = Engine.from_pretrained(model, mode=mode, dtype=dtype, **engine_options)
    fp8 = Engine.from_pretrained(model, mode=mode, dtype=dtype, quantization=quantization, **engine_options)
    if mode == "embed":
        return _evaluate_embed(baseline, fp8, texts, quantization, dtype)
    return _evaluate_generate(baseline, fp8, texts, quantization, dtype, num_tokens, max_tokens,
                              perplexity_text or " ".join(texts))


def _evaluate_embed(baseline: Engine, fp8: Engine, texts: list[str], quantization: str, dtype: str) -> QuantEval:
    figures = compare_embeddings(baseline, fp8, texts, {"normalize": True})
    stored, bf16 = fp8_weight_bytes(fp8._embedder.model)
    return QuantEval("embed", quantization, dtype, figures["num_rows"], stored, bf16,
                     cosine_mean=figures["cosine_mean"], cosine_min=figures["cosine_min"])


def _evaluate_generate(baseline: Engine, fp8: Engine, texts: list[str], quantization: str, dtype: str,
                       num_tokens: int, max_tokens: int, perplexity_text: str) -> QuantEval:
    ids = baseline.llm.tokenizer.encode(perplexity_text)[:num_tokens]
    if len(ids) < 2:
        raise ValueError(f"the sample text has {len(ids)} tokens; perplexity needs at least 2")
    prompts = texts[:max(1, len(texts) // 10)]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    theirs, ours = baseline.generate(prompts, params), fp8.generate(prompts, params)
    agreed = [common_prefix(a.token_ids, b.token_ids) for a, b in zip(theirs, ours)]
    stored, bf16 = fp8_weight_bytes(fp8.llm.runner.model)
    return QuantEval("generate", quantization, dtype, len(prompts), stored, bf16, num_tokens=len(ids),
                     perplexity_baseline=perplexity(baseline, ids), perplexity_fp8=perplexity(fp8, ids),
                     greedy_agreement=sum(agreed) / sum(len(a.token_ids) for a in theirs),
                     greedy_exact=sum(a.token_ids == b.token_ids for a, b in zip(theirs, ours)) / len(prompts))


def perplexity(engine: Engine, ids: list[int]) -> float:
    """exp of the mean negative log-likelihood of ids[1:], each given the tokens before it."""
    num_tokens, total = negative_log_likelihood(engine, [ids])
    return math.exp(total / num_tokens)
