"""Load a model's weights from model.safetensors (or its sharded index), memory-mapped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open


def weight_files(folder: str | Path) -> list[Path]:
    folder = Path(folder)
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / shard for shard in shards]
    raise FileNotFoundError(f"model.safetensors not found in model folder {folder} (only safetensors weights are supported)")


def load_weights(model: torch.nn.Module, folder: str | Path, rename: Callable[[str], str | None],
                 combine: Callable[[dict], dict] | None = None) -> None:
    """Assign every checkpoint tensor to the parameter `rename` maps it to.

    `rename` returns None for tensors the model does not use (pooler, MLM head).
    `combine`, when given, rewrites the renamed state before it is assigned (fusing
    Q, K and V into one tensor). The model may live on the meta device: parameters
    are replaced, not copied into.
    """
    state = read_weights(folder, rename)
    assign_weights(model, combine(state) if combine is not None else state, folder)


def read_weights(folder: str | Path, rename: Callable[[str], str | None]) -> dict[str, torch.Tensor]:
    """Every checkpoint tensor that `rename` keeps, under its new name."""
    state = {}
    for path in weight_files(folder):
        with safe_open(str(path), framework="pt") as checkpoint:
            for name in checkpoint.keys():
                ours = rename(name)
                if ours is not None:
                    state[ours] = checkpoint.get_tensor(name)
    return state


def assign_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], folder: str | Path) -> None:
    """load_state_dict(assign=True), with a mismatch reported as ValueError naming the tensors."""
    try:
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as error:      # shape mismatches
        raise ValueError(f"weights in {folder} do not fit the model config: {error}") from error
    if missing or unexpected:
        raise ValueError(
            f"weights in {folder} do not match the model: missing {sorted(missing)[:8]}, "
            f"unexpected {sorted(unexpected)[:8]}"
        )
