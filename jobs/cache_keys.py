"""What makes two results the same: the keys of the results cache (incremental jobs).

A cached result is reused only when everything that shaped it is unchanged. The
*namespace* hashes the model's revision (its config, tokenizer and weight files), the
mode and the mode's parameters (those a row's result depends on: jobs.scoring.result_params);
a *key* hashes one input value within it (a score row's: its query and its document). A
new model file, another `dimensions` or `max_tokens`, and every key changes with it.

A Hub model's revision is the commit its id resolved to at submit (jobs.hub_models).
A local model's revision is read from its files, not trusted from a name: for each weight
file its name, size and a hash of its first and last MiB (hashing whole multi-GB
checkpoints at every submission would cost more than the rows it saves); config and
tokenizer files are hashed whole.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from jobs.models import ModelRef
from jobs.scoring import result_params
from jobs.spec import JobSpec

CACHE_FORMAT = 1                # bump when the cached columns or the hashing change
STRUCTURED_DEFAULTS = 2         # bump when what a structured job's unset params mean changes
SAMPLE_BYTES = 1 << 20
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")
WHOLE_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "sentence_bert_config.json",
               "1_Pooling/config.json", "generation_config.json", "quantization_config.json")


def model_revision(path: str | Path) -> str:
    """A hash of a model folder's (or a single .gguf file's) contents, as above."""
    path = Path(path)
    digest = hashlib.sha256()
    if path.is_file():
        _sample_file(digest, path, path.name)
        return digest.hexdigest()
    for name in WHOLE_FILES:
        if (path / name).is_file():
            digest.update(name.encode() + b"\0" + (path / name).read_bytes())
    for weights in sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES):
        _sample_file(digest, weights, str(weights.relative_to(path)))
    return digest.hexdigest()


def model_identity(model: ModelRef) -> str:
    """What a job's results depend on of its model: a Hub model's commit (and GGUF file),
    so that two revisions never share results even where their files are equal; a
    local model's files (model_revision), hashed here or, for a model registered on the
    workers alone, by the worker that announced it (jobs.model_cards)."""
    if model.pinned:
        return f"hub:{model.key}"
    return model.revision or model_revision(model.path)


def _sample_file(digest, path: Path, name: str) -> None:
    size = path.stat().st_size
    digest.update(f"{name}\0{size}\0".encode())
    with open(path, "rb") as f:
        digest.update(f.read(SAMPLE_BYTES))
        if size > SAMPLE_BYTES:
            f.seek(max(SAMPLE_BYTES, size - SAMPLE_BYTES))
            digest.update(f.read(SAMPLE_BYTES))


def cache_namespace(spec: JobSpec, revision: str, adapter: str | None = None) -> str:
    """Results of jobs with equal namespaces are interchangeable row by row. `adapter`: the
    job's LoRA adapter's identity (jobs.adapters.adapter_identity: a hash of its two files).
    Adapters named per row are refused with incremental (jobs.validate), as per-row params are."""
    identity = {"format": CACHE_FORMAT, "model": revision, "mode": spec.mode,
                "params": result_params(spec.mode, spec.params), "quantization": spec.quantization}
    if spec.dtype is not None:      # absent otherwise, so the namespaces of earlier jobs stay as they were
        identity["dtype"] = spec.dtype
    if spec.kv_cache_dtype is not None:     # likewise: an fp8 KV cache gives other logprobs, other tokens
        identity["kv_cache_dtype"] = spec.kv_cache_dtype
    if adapter is not None:     # likewise: absent for the base model
        identity["adapter"] = adapter
    if spec.mode == "generate" and spec.params.get("structured") is not None:
        # Before STRUCTURED_DEFAULTS the same params meant any JSON whitespace and jump-forward on
        identity["structured_defaults"] = STRUCTURED_DEFAULTS
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


def keys_depend_on_row_id(spec: JobSpec) -> bool:
    """A generate job with a seed samples each row from a seed derived from its id
    (queueing.inference.row_seed): the same text under another id is another result."""
    return spec.mode == "generate" and spec.params.get("seed") is not None


def row_key(value: object, row_id: object = None) -> str | None:
    """The key of one input value (with its row id, when results depend on it); None
    for a null input, which is never cached (it is an error row)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        payload = b"b\0" + value
    elif isinstance(value, str):
        payload = b"s\0" + value.encode()
    else:   # chat messages and other structured values
        payload = b"j\0" + json.dumps(value, sort_keys=True, default=str).encode()
    if row_id is not None:
        payload = f"id\0{row_id!r}\0".encode() + payload
    return hashlib.sha256(payload).hexdigest()
