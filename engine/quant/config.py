"""Fp8Config: which FP8 scheme a model runs with — from the user's `quantization=` or from
the `quantization_config` a pre-quantized checkpoint ships in its config.json.

    quantization="fp8"         E4M3 weights, one scale per output channel (the default)
    quantization="fp8-block"   E4M3 weights, one scale per 128x128 block (DeepSeek / Qwen3-FP8)

Checkpoint formats read (and written by `barge quantize`):

    quant_method "fp8"                  Hugging Face / DeepSeek / Qwen3-FP8: weight_block_size
                                        [128, 128] and *.weight_scale_inv, or no block size
                                        and a per-tensor *.weight_scale
    quant_method "compressed-tensors"   llm-compressor, format "float-quantized": 8-bit float
                                        weights, strategy "channel" (or "tensor", "block"),
                                        *.weight_scale
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine.quant.fp8 import DEFAULT_BLOCK_SIZE, check_block_size, check_scale_method

QUANTIZATIONS = (None, "fp8", "fp8-block", "fp8-group")
WEIGHT_STRATEGIES = ("channel", "tensor", "block")
# What quantization="fp8" (and its variants) does when Barge quantizes, chosen by SmolLM2's
# perplexity over six held-out texts (engine.quant.evaluate.HELD_OUT_TEXTS), worst change:
#     absmax, all blocks FP8 +3.19 %     keep down_proj +1.51 %     mse scales +1.42 %
#     keep first/last block +1.38 %      first/last block + mse +0.87 %
# NOTE: "mse" is better but not the default: its search quantizes every weight 20 times, which
# made SmolLM2's load on the 2-core CPU minutes long, and first/last blocks alone meet the 2 %
# bar on every text. Fp8Config(scale_method="mse") is there to pass to quantize_state_dict.
DEFAULT_RECIPE = dict(scale_method="absmax", keep_edge_blocks=1, keep_layers=())
GROUP_BLOCK_SIZE = (1, 128)         # "fp8-group": one scale per row and 128 input columns


@dataclass(frozen=True)
class Fp8Config:
    block_size: tuple[int, int] | None = None    # None: per output channel; else (rows, cols)
    checkpoint_format: str | None = None         # "fp8" | "compressed-tensors" when read from a checkpoint
    # The recipe, applied when Barge quantizes (at load or `barge quantize`), see engine/quant/recipe.py:
    scale_method: str = "absmax"                 # "absmax" | "mse" (clipping search), engine/quant/fp8.py
    keep_edge_blocks: int = 0                    # the first and last N blocks of each stack stay 16-bit
    keep_layers: tuple[str, ...] = ()            # linears named "...<suffix>" stay 16-bit everywhere

    def __post_init__(self):
        check_scale_method(self.scale_method)
        if not isinstance(self.keep_edge_blocks, int) or self.keep_edge_blocks < 0:
            raise ValueError(f"keep_edge_blocks must be a non-negative int, got {self.keep_edge_blocks!r}")

    @property
    def name(self) -> str:
        if self.block_size is None:
            return "fp8"
        return "fp8-group" if self.block_size == GROUP_BLOCK_SIZE else "fp8-block"

    @property
    def block_cols(self) -> int | None:
        return None if self.block_size is None else self.block_size[1]


def fp8_config_from_name(quantization: str | None) -> Fp8Config | None:
    """The user's quantization= value -> Fp8Config with Barge's recipe, None for no quantization."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"unsupported quantization {quantization!r}; expected one of {QUANTIZATIONS}")
    if quantization is None:
        return None
    block_size = {"fp8": None, "fp8-block": DEFAULT_BLOCK_SIZE, "fp8-group": GROUP_BLOCK_SIZE}[quantization]
    return Fp8Config(block_size, **DEFAULT_RECIPE)


def fp8_config_from_hf(quantization_config: dict | None) -> Fp8Config | None:
    """config.json's quantization_config -> Fp8Config; None when the checkpoint is not quantized.
    A quantization we cannot run raises ValueError naming it rather than loading garbage."""
    if not quantization_config:
        return None
    method = quantization_config.get("quant_method")
    if method == "fp8":
        return _from_hf_fp8(quantization_config)
    if method == "compressed-tensors":
        return _from_compressed_tensors(quantization_config)
    raise ValueError(f"unsupported checkpoint quant_method {method!r}; Barge reads 'fp8' and 'compressed-tensors'")


def fp8_config_of_folder(folder: str | Path) -> Fp8Config | None:
    """The FP8 scheme a model folder's config.json declares, None when it declares none."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return None
    return fp8_config_from_hf(json.loads(path.read_text()).get("quantization_config"))


def _from_hf_fp8(config: dict) -> Fp8Config:
    if config.get("fmt", "e4m3") != "e4m3":
        raise ValueError(f"unsupported fp8 fmt {config.get('fmt')!r}; Barge reads 'e4m3'")
    block = config.get("weight_block_size")
    return Fp8Config(None if block is None else check_block_size(tuple(block)), "fp8")


def _from_compressed_tensors(config: dict) -> Fp8Config:
    groups = config.get("config_groups") or {}
    if not groups:
        raise ValueError("compressed-tensors quantization_config has no config_groups")
    schemes = {_ct_weight_scheme(name, group, config.get("format")) for name, group in groups.items()}
    if len(schemes) != 1:
        raise ValueError(f"compressed-tensors config_groups mix weight schemes {sorted(map(str, schemes))}; "
                         "Barge runs one FP8 scheme per model")
    return Fp8Config(schemes.pop(), "compressed-tensors")


def _ct_weight_scheme(name: str, group: dict, default_format: str | None) -> tuple[int, int] | None:
    fmt = group.get("format") or default_format
    weights = group.get("weights") or {}
    if fmt != "float-quantized" or weights.get("type") != "float" or weights.get("num_bits") != 8:
        raise ValueError(f"compressed-tensors group {name!r} is format {fmt!r}, {weights.get('num_bits')}-bit "
                         f"{weights.get('type')!r}; Barge reads 8-bit float ('float-quantized') only")
    strategy = weights.get("strategy")
    if strategy not in WEIGHT_STRATEGIES:
        raise ValueError(f"compressed-tensors weight strategy {strategy!r} in group {name!r}; "
                         f"expected one of {WEIGHT_STRATEGIES}")
    if strategy == "block":
        return check_block_size(tuple(weights.get("block_structure") or ()))
    return None         # per-tensor scales are loaded as per-channel ones, every row the same


def hf_quantization_config(config: Fp8Config, kept_16bit: list[str] = ()) -> dict:
    """What `barge quantize` writes into config.json: block (and 1x128 group) scales as
    Hugging Face's fp8 method (what Qwen3-FP8 and DeepSeek ship), per-channel scales as
    compressed-tensors (what llm-compressor's FP8_DYNAMIC writes; HF's fp8 method has no
    per-channel form). kept_16bit: the module names the recipe left unquantized."""
    not_converted = ["lm_head", *kept_16bit]
    if config.block_size is not None:
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": list(config.block_size), "modules_to_not_convert": not_converted}
    scheme = {"targets": ["Linear"], "format": "float-quantized",
              "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel",
                          "dynamic": False, "group_size": None, "block_structure": None},
              "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token",
                                    "dynamic": True, "group_size": None, "block_structure": None},
              "output_activations": None}
    return {"quant_method": "compressed-tensors", "format": "float-quantized",
            "quantization_status": "compressed", "config_groups": {"group_0": scheme},
            "ignore": not_converted, "kv_cache_scheme": None}
