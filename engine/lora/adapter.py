"""LoraAdapter: a PEFT adapter's tensors, read from a folder, an fsspec URL or the Hugging Face Hub,
and checked against the base model.

    base_model.model.model.layers.{N}.self_attn.{q,k,v,o}_proj.lora_A.weight   [r, in]
    base_model.model.model.layers.{N}.mlp.{gate,up,down}_proj.lora_B.weight    [out, r]

PEFT names the Hugging Face modules; Barge fuses q/k/v and gate/up into one linear each
(engine/models/llama.py), so a delta is kept per projection and added to its columns of
the fused output (engine/lora/linear.py). The rows of q and k are Hugging Face's
(rotate-half) order on every path: GGUF checkpoints are unpermuted at load
(engine/loader/gguf.py), so an adapter trained against transformers applies as it is
(tests/models/test_lora_parity.py checks it on SmolLM2's GGUF).

The adapter's identity is the hash of its two files' bytes: two names for the same bytes
share prefix-cache blocks, a retrained adapter under the same name does not.

A Hub adapter (`hf://org/name[@revision]`, or `org/name[@revision]` where no path of that
name exists) is fetched through huggingface_hub into its cache, its two files alone: a
job's adapter at the commit its submit pinned (jobs.adapters.pin_adapter), a row's at
whatever its revision names when the row is queued.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load as load_safetensors

from engine.generate.model_config import DecoderConfig
from engine.lora.adapter_config import (CONFIG_NAME, PROJECTIONS, WEIGHTS_NAME, AdapterConfig, AdapterError,
                                        parse_adapter_config)

_TENSOR_NAME = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])"
                          r"(?:\.\w+)?\.weight")
# A Hub id as jobs.hub_models spells a model's, less the GGUF quantization (an engine module
# imports nothing of jobs/, tests/unit/test_package_layers.py).
_HUB_PREFIX = "hf://"
_HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)(?:@(?P<revision>[^\s:@]+))?")
_BLOCK = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
          "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}

LoraPair = tuple[torch.Tensor, torch.Tensor]     # lora_A [r, in_features], lora_B [out_features, r]


@dataclass(frozen=True, eq=False)
class LoraAdapter:
    source: str               # the folder, URL or Hub id it was loaded from, as the caller named it
    adapter_id: str           # sha256 of adapter_config.json and the weights (16 hex digits)
    config: AdapterConfig
    weights: dict[tuple[int, str], LoraPair] = field(repr=False)    # (layer, projection) -> (A, B)

    @property
    def rank(self) -> int:
        return self.config.rank

    @property
    def projections(self) -> frozenset[str]:
        return frozenset(projection for _, projection in self.weights)


def projection_shapes(config: DecoderConfig) -> dict[str, tuple[int, int]]:
    """projection -> (in_features, out_features) of the base model's Hugging Face linears."""
    hidden, inter = config.hidden_size, config.intermediate_size
    q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    return {"q_proj": (hidden, q_size), "k_proj": (hidden, kv_size), "v_proj": (hidden, kv_size),
            "o_proj": (q_size, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden)}


def load_adapter(source: str | Path, config: DecoderConfig, max_rank: int, dtype: torch.dtype) -> LoraAdapter:
    """A PEFT adapter folder (or fsspec URL of one, or Hub id) -> LoraAdapter in `dtype`, on the host;
    AdapterError naming the problem when it does not fit the base model or max_rank."""
    source = str(source)
    config_bytes, weights_bytes = _read_files(source)
    adapter_config = parse_adapter_config(config_bytes, source, max_rank)
    try:
        tensors = load_safetensors(weights_bytes)
    except Exception as error:      # safetensors raises its own SafetensorError on a bad header
        raise AdapterError(f"adapter {source}: {WEIGHTS_NAME} is not a safetensors file ({error})") from None
    weights = _pairs(tensors, source, config.num_layers)
    _check_shapes(weights, adapter_config.rank, projection_shapes(config), source)
    digest = hashlib.sha256(config_bytes + b"\0" + weights_bytes).hexdigest()[:16]
    return LoraAdapter(source, digest, adapter_config,
                       {key: (a.to(dtype).contiguous(), b.to(dtype).contiguous()) for key, (a, b) in weights.items()})


def _read_files(source: str) -> tuple[bytes, bytes]:
    hub_id = _hub_id(source)
    if hub_id is not None:
        return _read_folder(_fetch_from_hub(*hub_id, source), source)
    if "://" in source:
        import fsspec       # only for URLs: a local folder needs none of it
        try:
            with fsspec.open(f"{source.rstrip('/')}/{CONFIG_NAME}", "rb") as config_file:
                config_bytes = config_file.read()
            with fsspec.open(f"{source.rstrip('/')}/{WEIGHTS_NAME}", "rb") as weights_file:
                return config_bytes, weights_file.read()
        except (OSError, ValueError) as error:
            raise AdapterError(f"adapter {source}: cannot be read ({error})") from None
    return _read_folder(Path(source), source)


def _read_folder(folder: Path, source: str) -> tuple[bytes, bytes]:
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        if not (folder / name).is_file():
            raise AdapterError(f"adapter {source}: no {name} (a PEFT adapter folder has {CONFIG_NAME} "
                               f"and {WEIGHTS_NAME})")
    return (folder / CONFIG_NAME).read_bytes(), (folder / WEIGHTS_NAME).read_bytes()


def _hub_id(source: str) -> tuple[str, str | None] | None:
    """(repo id, revision or None) of a Hub adapter, or None for a folder or URL: as at submit
    (jobs.adapters.hub_adapter), a path that exists here wins, and `hf://` never looks for one."""
    if not source.startswith(_HUB_PREFIX) and ("://" in source or Path(source).exists()):
        return None
    match = _HUB_ID.fullmatch(source.removeprefix(_HUB_PREFIX))
    if match is None and source.startswith(_HUB_PREFIX):
        raise AdapterError(f"adapter {source}: not a Hub id; expected hf://org/name[@revision]")
    return (match["repo"], match["revision"]) if match else None


def _fetch_from_hub(repo_id: str, revision: str | None, source: str) -> Path:
    """The snapshot folder holding the adapter's two files at `revision`, from the Hub cache or
    fetched into it; one snapshot_download resolves the revision once, so both files are one
    commit's. Offline (HF_HUB_OFFLINE), the cache alone. AdapterError with huggingface_hub's
    reason when they cannot be had."""
    import httpx2
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled,
                                        RevisionResolutionError)
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=[CONFIG_NAME, WEIGHTS_NAME]))
    except (HfHubHTTPError, RevisionResolutionError, LocalEntryNotFoundError, OfflineModeIsEnabled,
            httpx2.TransportError) as error:
        reason = " ".join(str(error).split())
        raise AdapterError(f"adapter {source}: cannot be fetched from the Hugging Face Hub "
                           f"({type(error).__name__}): {reason}") from None


def _pairs(tensors: dict[str, torch.Tensor], source: str, num_layers: int) -> dict[tuple[int, str], LoraPair]:
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        match = _TENSOR_NAME.fullmatch(name)
        if match is None or _BLOCK.get(match[3]) != match[2]:
            raise AdapterError(f"adapter {source}: tensor {name} is not a LoRA weight of "
                               f"{', '.join(PROJECTIONS)} (embeddings, heads and biases are not served)")
        layer = int(match[1])
        if layer >= num_layers:
            raise AdapterError(f"adapter {source}: tensor {name} is for layer {layer}; the base model has "
                               f"{num_layers} layers")
        halves.setdefault((layer, match[3]), {})[match[4]] = tensor
    if not halves:
        raise AdapterError(f"adapter {source}: {WEIGHTS_NAME} holds no LoRA weights")
    for (layer, projection), pair in halves.items():
        if set(pair) != {"A", "B"}:
            missing = "lora_B" if "A" in pair else "lora_A"
            raise AdapterError(f"adapter {source}: layers.{layer}.{projection} has no {missing}")
    return {key: (pair["A"], pair["B"]) for key, pair in sorted(halves.items())}


def _check_shapes(weights: dict[tuple[int, str], LoraPair], rank: int, shapes: dict[str, tuple[int, int]],
                  source: str) -> None:
    for (layer, projection), (a, b) in weights.items():
        in_features, out_features = shapes[projection]
        for half, tensor, expected in (("lora_A", a, (rank, in_features)), ("lora_B", b, (out_features, rank))):
            if tuple(tensor.shape) != expected:
                raise AdapterError(f"adapter {source}: layers.{layer}.{projection}.{half} has shape "
                                   f"{list(tensor.shape)}; r={rank} on this base model needs {list(expected)}")
            if not tensor.is_floating_point():
                raise AdapterError(f"adapter {source}: layers.{layer}.{projection}.{half} is {tensor.dtype}, "
                                   f"not a float tensor")
