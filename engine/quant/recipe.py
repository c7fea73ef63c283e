"""Which linear layers of a state dict go to FP8 and which stay 16-bit: the layer half of
Barge's FP8 recipe (the scale half is engine/quant/fp8.py's scale_method).

    keep_edge_blocks = 1     model.layers.0.* and model.layers.{last}.* stay 16-bit, per
                             stack (Whisper's encoder and decoder each keep their own ends),
                             in stacks of 8 blocks or more (MAX_EDGE_SHARE)
    keep_layers = ("mlp.down_proj",)   every linear whose name ends so stays 16-bit

NOTE: the first and last blocks are where a small model's quantization error costs most:
the first block's outputs feed every later one, and the last block's go straight to the
LM head (or the pooled embedding) with nothing after them to absorb the error. Kept layers
are plain nn.Linear at run time; `barge quantize` writes them unquantized and lists them in
the checkpoint's ignore list, so any reader leaves them alone.
"""

from __future__ import annotations

import re
from collections import defaultdict

from engine.quant.config import Fp8Config

# A stack keeps its edge blocks only where they are at most a quarter of it: in a shallow
# stack (MiniLM's 6 layers, Whisper's 4 or 6) they would take most of FP8's saving with them.
MAX_EDGE_SHARE = 0.25
# "<stack>.<N>.rest": the stack is everything up to the block number (model.layers,
# model.encoder.layers, encoder.layer), so blocks count per stack.
BLOCK_NAME = re.compile(r"^(?P<stack>(?:.*\.)?layers?)\.(?P<index>\d+)\.(?P<rest>.+)$")


def kept_16bit(names: list[str], config: Fp8Config) -> set[str]:
    """The target weight names (of `names`, all of a model's targets) the recipe keeps 16-bit."""
    edges = _edge_blocks(names, config.keep_edge_blocks)
    kept = set()
    for name in names:
        match = BLOCK_NAME.match(name)
        module = name.removesuffix(".weight")
        if match and (match["stack"], int(match["index"])) in edges:
            kept.add(name)
        elif any(module.endswith(suffix) for suffix in config.keep_layers):
            kept.add(name)
    return kept


def _edge_blocks(names: list[str], num_edge: int) -> set[tuple[str, int]]:
    indices = defaultdict(set)
    for name in names:
        match = BLOCK_NAME.match(name)
        if match:
            indices[match["stack"]].add(int(match["index"]))
    edges = set()
    for stack, found in indices.items():
        ordered = sorted(found)
        if 2 * num_edge > len(ordered) * MAX_EDGE_SHARE:
            continue
        edges.update((stack, index) for index in ordered[:num_edge] + ordered[-num_edge:] if num_edge)
    return edges


def describe_kept(names: list[str]) -> str:
    """Module names kept 16-bit -> one short line: whole blocks by number, the rest by name."""
    if not names:
        return "none"
    by_block = defaultdict(list)
    for name in names:
        match = BLOCK_NAME.match(name)
        key = (match["stack"], int(match["index"])) if match else ("", -1)
        by_block[key].append(match["rest"] if match else name)
    parts = [f"{stack}.{index} ({', '.join(sorted(rest))})" if stack else ", ".join(sorted(rest))
             for (stack, index), rest in sorted(by_block.items())]
    return f"{len(names)} linears: " + "; ".join(parts)


def describe_recipe(config: Fp8Config) -> str:
    """The recipe as Barge applies it when quantizing, for eval-quant and the job's FP8 check."""
    kept = [f"first and last {config.keep_edge_blocks} block(s)"] if config.keep_edge_blocks else []
    kept += [f"every {suffix}" for suffix in config.keep_layers]
    return (f"{config.name}, {config.scale_method} scales, 16-bit: " + (", ".join(kept) or "none"))


def kept_linears(model) -> list[str]:
    """The linear layers inside numbered blocks that a model with FP8 layers left 16-bit
    (nn.Linear, or the PackedLinear it became on CPU, beside Fp8Linear ones): what the
    recipe actually did to this model."""
    from torch import nn

    from engine.layers.fp8_linear import Fp8Linear
    from engine.layers.packed_linear import PackedLinear
    modules = dict(model.named_modules())
    if not any(isinstance(module, Fp8Linear) for module in modules.values()):
        return []
    return [name for name, module in modules.items()
            if isinstance(module, (nn.Linear, PackedLinear)) and BLOCK_NAME.match(name)]


def model_of(engine):
    """The torch model behind an engine.Engine of any mode; None for anything else."""
    if getattr(engine, "mode", None) == "generate":
        return getattr(getattr(getattr(engine, "llm", None), "runner", None), "model", None)
    if getattr(engine, "mode", None) == "embed":
        return getattr(getattr(engine, "_embedder", None), "model", None)
    decoder = getattr(getattr(engine, "transcriber", None), "decoder", None)
    return getattr(decoder, "model", None)
