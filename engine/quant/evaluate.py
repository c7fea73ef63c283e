"""The FP8 quality check as a feature (`barge eval-quant MODEL`): the same model loaded twice,
16/32-bit and FP8, on the same sample.

    embed     cosine similarity of each text's two embeddings: mean and minimum
    generate  perplexity of both on each of several held-out texts, and greedy agreement
              on a set of prompts

The comparisons themselves are engine.quant.compare's, which a job's own check
(JobSpec.quant_check_rows) runs on the job's rows. Both print the recipe (scale method,
what stays 16-bit) and the block linears the FP8 model actually kept 16-bit.

With kv_cache_dtype="fp8" (generate only), two more engines score the same texts with an
E4M3 KV cache (engine/generate/kv_cache.py): the baseline's weights, and the FP8 weights.
Perplexity is scored from prompt logprobs, and with an fp8 cache every prompt token's
attention reads the dequantized cache (engine/generate/runner.py builds a first chunk as
a read of the cache too), so the figures are what the cache costs on every token.

NOTE: one text is not enough to choose a recipe by: on SmolLM2 the absmax recipe cost
+1.2 % on GPL-3 but +3.2 % on dpkg's triggers spec. HELD_OUT_TEXTS mixes licences and
package documentation that Debian installs and the project neither ships nor trains on.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

from engine.embed.config import is_embedding_folder
from engine.engine import Engine
from engine.generate import SamplingParams
from engine.layers.fp8_linear import fp8_weight_bytes
from engine.quant.compare import compare_embeddings, negative_log_likelihood, recipe_fields
from engine.token_ids import common_prefix

LICENSES = Path("/usr/share/common-licenses")
HELD_OUT_TEXTS = {"GPL-3": LICENSES / "GPL-3", "Apache-2.0": LICENSES / "Apache-2.0",
                  "MPL-2.0": LICENSES / "MPL-2.0", "GFDL-1.3": LICENSES / "GFDL-1.3",
                  "git-subtree": Path("/usr/share/doc/git/contrib/subtree/git-subtree.txt"),
                  "dpkg-triggers": Path("/usr/share/doc/dpkg/spec/triggers.txt")}
SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+")
MIN_SENTENCE_CHARS, MAX_SENTENCE_CHARS = 20, 400


@dataclass(frozen=True)
class TextPerplexity:
    name: str                           # the text's name (a file name)
    num_tokens: int                     # tokens scored: its first num_tokens
    baseline: float
    fp8: float
    kv_fp8: float | None = None         # the baseline's weights with an fp8 KV cache
    both_fp8: float | None = None       # FP8 weights and an fp8 KV cache

    @property
    def change(self) -> float:
        return self.fp8 / self.baseline - 1

    @property
    def kv_change(self) -> float | None:
        return None if self.kv_fp8 is None else self.kv_fp8 / self.baseline - 1

    @property
    def both_change(self) -> float | None:
        return None if self.both_fp8 is None else self.both_fp8 / self.baseline - 1


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
    recipe: str | None = None           # how Barge quantized (engine.quant.recipe.describe_recipe)
    kept_16bit: str | None = None       # the block linears the FP8 model left 16-bit
    perplexities: tuple[TextPerplexity, ...] = ()   # generate: one per held-out text
    greedy_agreement: float | None = None   # generated tokens equal before the first divergence / all
    greedy_exact: float | None = None       # prompts whose whole greedy output is identical
    kv_cache_dtype: str = "auto"            # "fp8": perplexities with an fp8 KV cache too

    def format(self) -> str:
        lines = [f"{self.mode} model, {self.quantization} vs {self.baseline_dtype}, {self.num_samples} samples",
                 f"  FP8 layer weights: {self.fp8_weight_bytes / 2**20:.1f} MiB "
                 f"({self.fp8_weight_bytes / self.bf16_weight_bytes:.1%} of bf16's {self.bf16_weight_bytes / 2**20:.1f} MiB)",
                 f"  recipe: {self.recipe}", f"  kept 16-bit: {self.kept_16bit}"]
        if self.mode == "embed":
            lines.append(f"  embedding cosine: mean {self.cosine_mean:.5f}, min {self.cosine_min:.5f}")
        else:
            for text in self.perplexities:
                lines.append(f"  perplexity over {text.num_tokens} tokens of {text.name}: {self.baseline_dtype} "
                             f"{text.baseline:.3f}, {self.quantization} {text.fp8:.3f} ({text.change:+.2%})"
                             + self._fp8_kv_figures(text))
            lines.append(f"  worst perplexity change: {self.worst_perplexity_change:+.2%}")
            if self.kv_cache_dtype == "fp8":
                lines.append(f"  worst perplexity change with the fp8 KV cache: {self.worst_kv_change:+.2%} "
                             f"({self.baseline_dtype} weights), {self.worst_both_change:+.2%} "
                             f"({self.quantization} weights)")
            lines.append(f"  greedy agreement: {self.greedy_agreement:.1%} of tokens, "
                         f"{self.greedy_exact:.1%} of prompts identical")
        return "\n".join(lines)

    def _fp8_kv_figures(self, text: TextPerplexity) -> str:
        if text.kv_fp8 is None:
            return ""
        return (f"; fp8 KV cache: {self.baseline_dtype} {text.kv_fp8:.3f} ({text.kv_change:+.2%}), "
                f"{self.quantization} {text.both_fp8:.3f} ({text.both_change:+.2%})")

    @property
    def worst_perplexity_change(self) -> float | None:
        return max((text.change for text in self.perplexities), default=None)

    @property
    def worst_kv_change(self) -> float | None:
        """The largest change with an fp8 KV cache and the baseline's weights (kv_cache_dtype="fp8")."""
        return max((text.kv_change for text in self.perplexities if text.kv_fp8 is not None), default=None)

    @property
    def worst_both_change(self) -> float | None:
        """The largest change with an fp8 KV cache and FP8 weights."""
        return max((text.both_change for text in self.perplexities if text.both_fp8 is not None), default=None)


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


def held_out_texts() -> dict[str, str]:
    """HELD_OUT_TEXTS that this machine has, name -> text."""
    return {name: path.read_text(encoding="utf-8", errors="replace")
            for name, path in HELD_OUT_TEXTS.items() if path.is_file()}


def evaluate(model: str | Path, quantization: str = "fp8", mode: str | None = None, texts: list[str] | None = None,
             dtype: str = "float32", num_samples: int = 500, num_tokens: int = 1024, max_tokens: int = 32,
             perplexity_texts: dict[str, str] | None = None, kv_cache_dtype: str = "auto",
             **engine_options) -> QuantEval:
    """Load `model` in `dtype` and with `quantization`, and compare them (see the module doc).
    texts: the sample (default: sentences of /usr/share/common-licenses). For generate,
    perplexity is over the first num_tokens tokens of each of perplexity_texts (name ->
    text; default: HELD_OUT_TEXTS, or the sample joined where the machine has none of them),
    and the first len(texts) // 10 texts are the greedy prompts. kv_cache_dtype="fp8": the
    perplexities with an fp8 KV cache too, under both weights (see the module doc)."""
    if quantization not in ("fp8", "fp8-block", "fp8-group"):
        raise ValueError(f"unsupported quantization {quantization!r}; expected 'fp8', 'fp8-block' or 'fp8-group'")
    mode = mode or detect_mode(model)
    if mode not in ("embed", "generate"):
        raise ValueError(f"eval-quant compares embed or generate models, not mode {mode!r}")
    if kv_cache_dtype not in ("auto", "fp8"):
        raise ValueError(f"kv_cache_dtype must be 'auto' or 'fp8', got {kv_cache_dtype!r}")
    if kv_cache_dtype == "fp8" and mode != "generate":
        raise ValueError(f"kv_cache_dtype applies to generate models, not mode {mode!r}")
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
    perplexity_texts = perplexity_texts or held_out_texts() or {"the sample": " ".join(texts)}
    result = _evaluate_generate(baseline, fp8, texts, quantization, dtype, num_tokens, max_tokens, perplexity_texts)
    if kv_cache_dtype == "auto":
        return result
    del fp8     # one engine at a time beside the baseline from here
    return replace(result, kv_cache_dtype="fp8", perplexities=with_fp8_kv_cache(
        result.perplexities, baseline, perplexity_texts, num_tokens,
        lambda weights: Engine.from_pretrained(model, mode=mode, dtype=dtype, quantization=weights,
                                               kv_cache_dtype="fp8", **engine_options), quantization))


def _evaluate_embed(baseline: Engine, fp8: Engine, texts: list[str], quantization: str, dtype: str) -> QuantEval:
    figures = compare_embeddings(baseline, fp8, texts, {"normalize": True})
    stored, bf16 = fp8_weight_bytes(fp8._embedder.model)
    return QuantEval("embed", quantization, dtype, figures["num_rows"], stored, bf16, **recipe_fields(fp8),
                     cosine_mean=figures["cosine_mean"], cosine_min=figures["cosine_min"])


def _evaluate_generate(baseline: Engine, fp8: Engine, texts: list[str], quantization: str, dtype: str,
                       num_tokens: int, max_tokens: int, perplexity_texts: dict[str, str]) -> QuantEval:
    prompts = texts[:max(1, len(texts) // 10)]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    theirs, ours = baseline.generate(prompts, params), fp8.generate(prompts, params)
    agreed = [common_prefix(a.token_ids, b.token_ids) for a, b in zip(theirs, ours)]
    stored, bf16 = fp8_weight_bytes(fp8.llm.runner.model)
    return QuantEval("generate", quantization, dtype, len(prompts), stored, bf16, **recipe_fields(fp8),
                     perplexities=tuple(text_perplexity(baseline, fp8, name, text, num_tokens)
                                        for name, text in perplexity_texts.items()),
                     greedy_agreement=sum(agreed) / sum(len(a.token_ids) for a in theirs),
                     greedy_exact=sum(a.token_ids == b.token_ids for a, b in zip(theirs, ours)) / len(prompts))


def with_fp8_kv_cache(perplexities: tuple[TextPerplexity, ...], baseline: Engine, texts: dict[str, str],
                      num_tokens: int, load, quantization: str) -> tuple[TextPerplexity, ...]:
    """The same texts scored by an engine with an fp8 KV cache, first with the baseline's
    weights, then with FP8 ones: load(None or quantization) builds each in turn."""
    ids = {name: baseline.llm.tokenizer.encode(text)[:num_tokens] for name, text in texts.items()}
    figures = {}
    for weights in (None, quantization):
        engine = load(weights)
        figures[weights] = {name: perplexity(engine, ids[name]) for name in texts}
        del engine
    return tuple(replace(text, kv_fp8=figures[None][text.name], both_fp8=figures[quantization][text.name])
                 for text in perplexities)


def text_perplexity(baseline: Engine, fp8: Engine, name: str, text: str, num_tokens: int) -> TextPerplexity:
    ids = baseline.llm.tokenizer.encode(text)[:num_tokens]
    if len(ids) < 2:
        raise ValueError(f"the text {name!r} has {len(ids)} tokens; perplexity needs at least 2")
    return TextPerplexity(name, len(ids), perplexity(baseline, ids), perplexity(fp8, ids))


def perplexity(engine: Engine, ids: list[int]) -> float:
    """exp of the mean negative log-likelihood of ids[1:], each given the tokens before it."""
    num_tokens, total = negative_log_likelihood(engine, [ids])
    return math.exp(total / num_tokens)
