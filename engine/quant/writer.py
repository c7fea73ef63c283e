"""quantize_checkpoint: a 16/32-bit Hugging Face model folder -> an FP8 one (`barge quantize`).

Offline, once, so that every worker reads half the weight bytes at start instead of
quantizing at load. Shard by shard, so memory stays at one shard's tensors.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engine.loader.safetensors import weight_files
from engine.quant.checkpoint import to_checkpoint
from engine.quant.config import fp8_config_from_name, hf_quantization_config
from engine.quant.recipe import kept_16bit
from engine.quant.state import is_block_linear_weight, quantize_state_dict

INDEX_NAME = "model.safetensors.index.json"
SAFETENSORS_FLOATS = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
# Other weight formats in a source folder would be stale full-precision copies.
SKIPPED_FILES = ("*.safetensors", INDEX_NAME, "*.bin", "*.pt", "*.pth", "*.onnx", "*.h5", "*.msgpack",
                 "*.ot", "*.gguf", ".gitattributes")


@dataclass(frozen=True)
class QuantizeReport:
    num_quantized: int          # linear weights now float8
    bytes_before: int           # tensor bytes read
    bytes_after: int            # tensor bytes written


def quantize_checkpoint(source: str | Path, destination: str | Path, quantization: str = "fp8") -> QuantizeReport:
    """Write `destination`: source's files, its weights with every block linear layer the
    recipe does not keep 16-bit in FP8, and config.json's quantization_config saying how
    (see engine/quant/config.py), the kept layers in its ignore list."""
    source, destination = Path(source), Path(destination)
    if quantization is None:
        raise ValueError("quantization None: nothing to do; expected 'fp8' or 'fp8-block'")
    config = fp8_config_from_name(quantization)
    hf_config = _source_config(source)
    if destination.exists() and any(destination.iterdir()):
        raise ValueError(f"destination {destination} exists and is not empty")
    files = weight_files(source)
    targets = _target_names(files)
    kept = sorted(kept_16bit(targets, config))
    shutil.copytree(source, destination, ignore=shutil.ignore_patterns(*SKIPPED_FILES), dirs_exist_ok=True)
    num_quantized = bytes_before = bytes_after = 0
    weight_map = {}
    for path in files:
        state, metadata = _read(path)
        written = to_checkpoint(quantize_state_dict(state, config, all_targets=targets), config)
        num_quantized += sum(1 for name in written if name.endswith(("weight_scale", "weight_scale_inv")))
        bytes_before += sum(t.nbytes for t in state.values())
        bytes_after += sum(t.nbytes for t in written.values())
        save_file({name: t.contiguous() for name, t in written.items()}, str(destination / path.name),
                  metadata={**metadata, "format": "pt"})
        weight_map.update({name: path.name for name in written})
    if len(files) > 1:
        (destination / INDEX_NAME).write_text(json.dumps(
            {"metadata": {"total_size": bytes_after}, "weight_map": dict(sorted(weight_map.items()))}, indent=2))
    hf_config["quantization_config"] = hf_quantization_config(config, [name.removesuffix(".weight") for name in kept])
    (destination / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    return QuantizeReport(num_quantized, bytes_before, bytes_after)


def _source_config(source: Path) -> dict:
    if source.is_file():
        raise ValueError(f"source {source} is a file; barge quantize reads a Hugging Face model folder "
                         "(config.json + safetensors); GGUF models can be quantized at load instead")
    config_path = source / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"config.json not found in model folder {source}")
    hf_config = json.loads(config_path.read_text())
    if hf_config.get("quantization_config"):
        method = hf_config["quantization_config"].get("quant_method")
        raise ValueError(f"source {source} is already quantized (quant_method {method!r})")
    return hf_config


def _target_names(files: list[Path]) -> list[str]:
    """The whole model's target weight names, from the files' headers (no tensor is read):
    the recipe's first and last blocks are the model's, whatever shard they are in."""
    names = []
    for path in files:
        with safe_open(str(path), framework="pt") as checkpoint:
            for name in checkpoint.keys():
                header = checkpoint.get_slice(name)
                dtype = SAFETENSORS_FLOATS.get(header.get_dtype(), torch.int32)
                if is_block_linear_weight(name, torch.empty(header.get_shape(), dtype=dtype, device="meta")):
                    names.append(name)
    return names


def _read(path: Path) -> tuple[dict, dict]:
    with safe_open(str(path), framework="pt") as checkpoint:
        return {name: checkpoint.get_tensor(name) for name in checkpoint.keys()}, checkpoint.metadata() or {}
