"""A job's LoRA adapter, checked at submit before anything is queued (JobSpec.adapter).

    readable     adapter_config.json and adapter_model.safetensors at the folder or URL
    config       one Barge serves (engine.lora.adapter_config): PEFT's LORA, no DoRA, no
                 bias, r at most the deployment's max rank (Settings.max_lora_rank)
    fits         its tensors' names and shapes against the base's config.json where this
                 host has one (engine.lora.adapter_shapes); a GGUF base has none here, so
                 the worker's load checks it, and a misfit is every row's error

Only the config and the safetensors header are read, never the weights, except for an
incremental job: its results cache is keyed on the adapter's bytes (adapter_identity).
Adapters named per row (params.adapter_column) are data: the worker's engine reads each,
and one that cannot serve is that row's error.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from pathlib import Path

from engine.lora.adapter_config import CONFIG_NAME, WEIGHTS_NAME, AdapterError, parse_adapter_config   # torch-free
from engine.lora.adapter_shapes import check_tensor_shapes, read_tensor_shapes   # torch-free
from jobs.models import ModelRef
from jobs.spec import JobSpecError
from storage.fs import describe, redact, resolve

BASE_SIZES = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers")   # config.json's


def check_adapter(location: str, model: ModelRef, max_rank: int, shown_as: str | None = None) -> None:
    """JobSpecError naming "adapter" when the adapter at `location` cannot serve on `model`.
    `shown_as`: the name the messages give it instead of its location, and no storage error's
    text (which quotes paths): an OpenAI batch line names an adapter the server registered
    (api.batch_adapters), and its client is not shown where the server keeps it."""
    source = shown_as or redact(location)
    try:
        fs, folder = resolve(location)
        with fs.open(posixpath.join(folder, CONFIG_NAME), "rb") as config_file:
            config = parse_adapter_config(config_file.read(), source, max_rank)
        with fs.open(posixpath.join(folder, WEIGHTS_NAME), "rb") as weights_file:
            shapes = read_tensor_shapes(weights_file, source)
        base_config = _base_config(model)
        if base_config is not None:
            check_tensor_shapes(shapes, config.rank, base_config, source)
    except AdapterError as error:
        raise JobSpecError("adapter", str(error)) from None
    except (OSError, ValueError) as error:
        detail = describe(error) if shown_as is None else type(error).__name__
        raise JobSpecError("adapter", f"adapter {source} cannot be read: {detail} (a PEFT "
                                      f"adapter is a folder or URL holding {CONFIG_NAME} and {WEIGHTS_NAME})") from None


def adapter_identity(location: str) -> str:
    """sha256 of the adapter's two files, as the engine keys it (engine.lora.adapter): the
    same bytes under another name are the same adapter, a retrained one under the same name is not."""
    fs, folder = resolve(location)
    digest = hashlib.sha256(fs.cat_file(posixpath.join(folder, CONFIG_NAME)) + b"\0")
    with fs.open(posixpath.join(folder, WEIGHTS_NAME), "rb") as weights_file:
        while chunk := weights_file.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def _base_config(model: ModelRef) -> dict | None:
    """The base's config.json, or None where this host has none (a GGUF file) or it lacks a
    size the check needs: the worker's load checks the shapes then."""
    config = Path(model.path, "config.json")
    if not config.is_file():
        return None
    raw = json.loads(config.read_text())
    return raw if all(isinstance(raw.get(name), int) for name in BASE_SIZES) else None
