"""A job's LoRA adapter, checked at submit before anything is queued (JobSpec.adapter).

    readable     adapter_config.json and adapter_model.safetensors at the folder or URL, or
                 in the Hub repo at the commit its revision names (hub_adapter, pin_adapter)
    config       one Barge serves (engine.lora.adapter_config): PEFT's LORA, no DoRA, no
                 bias, r at most the deployment's max rank (Settings.max_lora_rank)
    fits         its tensors' names and shapes against the base's config.json where this
                 host has one (engine.lora.adapter_shapes); a GGUF base has none here, so
                 the worker's load checks it, and a misfit is every row's error

Only the config and the safetensors header are read, never the weights, except for an
incremental job on a folder or URL: its results cache is keyed on the adapter's bytes
(adapter_identity). Adapters named per row (params.adapter_column) are data: the worker's
engine reads each, and one that cannot serve is that row's error.

A Hub adapter is named as a model is (jobs.hub_models): `org/name[@revision]`, where no
path of that name exists here, or `hf://org/name[@revision]`. A submit stores it pinned,
`hf://org/name@<commit>`, so that every worker loads that commit's bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from pathlib import Path

from engine.lora.adapter_config import CONFIG_NAME, WEIGHTS_NAME, AdapterError, parse_adapter_config   # torch-free
from engine.lora.adapter_shapes import check_tensor_shapes, read_tensor_shapes   # torch-free
from jobs.hub_models import (HUB_PREFIX, HubId, cached_file, fetch_file, hub_errors, parse_hub_id, resolve_commit,
                             safetensors_shapes)
from jobs.models import ModelRef
from jobs.spec import JobSpecError
from storage.fs import describe, redact, redact_urls, resolve

BASE_SIZES = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers")   # config.json's
TensorShapes = dict[str, tuple[int, ...]]    # tensor name -> shape, from a safetensors header


def check_adapter(location: str, model: ModelRef, max_rank: int, shown_as: str | None = None) -> None:
    """JobSpecError naming "adapter" when the adapter at `location` cannot serve on `model`.
    `shown_as`: the name the messages give it instead of its location, and no storage error's
    text (which quotes paths): an OpenAI batch line names an adapter the server registered
    (api.batch_adapters), and its client is not shown where the server keeps it."""
    source = shown_as or redact(location)
    hub_id = hub_adapter(location)
    try:
        config_bytes, shapes = (_read_hub(hub_id, source, shown_as) if hub_id is not None
                                else _read_location(location, source))
        config = parse_adapter_config(config_bytes, source, max_rank)
        base_config = _base_config(model)
        if base_config is not None:
            check_tensor_shapes(shapes, config.rank, base_config, source)
    except AdapterError as error:
        raise JobSpecError("adapter", str(error)) from None
    except (OSError, ValueError) as error:
        detail = describe(error) if shown_as is None else type(error).__name__
        raise JobSpecError("adapter", f"adapter {source} cannot be read: {detail} (a PEFT "
                                      f"adapter is a folder or URL holding {CONFIG_NAME} and {WEIGHTS_NAME})") from None


def hub_adapter(location: str) -> HubId | None:
    """The Hub id an adapter location spells, or None for a folder or URL. As with models, a
    path that exists here wins over the Hub id of its name, and `hf://` never looks for one.
    JobSpecError for an `hf://` location that is no Hub id, or one naming a GGUF quantization."""
    if not location.startswith(HUB_PREFIX) and ("://" in location or os.path.exists(location)):
        return None
    try:
        hub_id = parse_hub_id(location)
    except ValueError:
        hub_id = None
    if location.startswith(HUB_PREFIX) and (hub_id is None or hub_id.quantization):
        raise JobSpecError("adapter", f"{location!r} is not a Hub id of an adapter; expected hf://org/name[@revision]")
    return None if hub_id is None or hub_id.quantization else hub_id


def pin_adapter(location: str) -> str:
    """The location a job stores for its adapter: a Hub id at the commit its revision names now,
    `hf://org/name@<commit>` (hf://, so that no worker takes it for a folder of that name, and
    jobs.hosts for a path on this host's disk); any other location as it is. JobSpecError
    naming "adapter", with huggingface_hub's reason, when the revision cannot be resolved."""
    hub_id = hub_adapter(location)
    if hub_id is None:
        return location
    return f"{HUB_PREFIX}{hub_id.repo_id}@{_commit(hub_id, redact(location))}"


def adapter_identity(location: str) -> str:
    """What an incremental job's results cache is keyed on. A Hub adapter: its repo and commit
    ("hub:org/name@<commit>", as a Hub model's is, jobs.cache_keys.model_identity), so a submit
    fetches no weights and another commit never shares results, even with equal bytes. Any
    other: the sha256 of its two files, as the engine keys it (engine.lora.adapter): the same
    bytes under another name are the same adapter, a retrained one under the same name is not."""
    hub_id = hub_adapter(location)
    if hub_id is not None:
        return f"hub:{hub_id.repo_id}@{_commit(hub_id, redact(location))}"
    fs, folder = resolve(location)
    digest = hashlib.sha256(fs.cat_file(posixpath.join(folder, CONFIG_NAME)) + b"\0")
    with fs.open(posixpath.join(folder, WEIGHTS_NAME), "rb") as weights_file:
        while chunk := weights_file.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def _read_location(location: str, source: str) -> tuple[bytes, TensorShapes]:
    """A folder's or URL's config bytes and the weights' tensor shapes (their header alone)."""
    fs, folder = resolve(location)
    with fs.open(posixpath.join(folder, CONFIG_NAME), "rb") as config_file:
        config_bytes = config_file.read()
    with fs.open(posixpath.join(folder, WEIGHTS_NAME), "rb") as weights_file:
        return config_bytes, read_tensor_shapes(weights_file, source)


def _read_hub(hub_id: HubId, source: str, shown_as: str | None) -> tuple[bytes, TensorShapes]:
    """The config's bytes (fetched into the Hub cache: a few hundred bytes) and the weights'
    tensor shapes at the commit the id names: from the cached weights' header, else from a
    ranged read of it on the Hub (jobs.hub_models.safetensors_shapes), so a submit fetches no
    weights. AdapterError with huggingface_hub's reason when they cannot be had."""
    try:
        commit = resolve_commit(hub_id)
        config_bytes = fetch_file(hub_id.repo_id, commit, CONFIG_NAME).read_bytes()
        cached = cached_file(hub_id.repo_id, commit, WEIGHTS_NAME)
        if cached is None:
            return config_bytes, safetensors_shapes(hub_id.repo_id, commit, WEIGHTS_NAME)
        with open(cached, "rb") as weights_file:
            return config_bytes, read_tensor_shapes(weights_file, source)
    except hub_errors() as error:
        raise AdapterError(_hub_refusal(source, error, shown_as)) from None


def _commit(hub_id: HubId, source: str) -> str:
    try:
        return resolve_commit(hub_id)
    except hub_errors() as error:
        raise JobSpecError("adapter", _hub_refusal(source, error, None)) from None


def _hub_refusal(source: str, error: Exception, shown_as: str | None) -> str:
    reason = "" if shown_as is not None else ": " + redact_urls(" ".join(str(error).split()))
    return (f"adapter {source} cannot be read from the Hugging Face Hub ({type(error).__name__}){reason} "
            f"(a PEFT adapter's repo holds {CONFIG_NAME} and {WEIGHTS_NAME})")


def _base_config(model: ModelRef) -> dict | None:
    """The base's config.json, or None where this host has none (a GGUF file) or it lacks a
    size the check needs: the worker's load checks the shapes then."""
    config = Path(model.path, "config.json")
    if not config.is_file():
        return None
    raw = json.loads(config.read_text())
    return raw if all(isinstance(raw.get(name), int) for name in BASE_SIZES) else None
