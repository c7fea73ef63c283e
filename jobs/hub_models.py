"""Models by their Hugging Face Hub ids: `org/name`, `org/name@revision` (a branch, tag
or commit), `hf://org/name`, and `org/name:Q4_1` for one quantization of a GGUF repo.

Everything goes through huggingface_hub with its own settings (HF_HOME or HF_HUB_CACHE,
HF_HUB_OFFLINE, HF_TOKEN, HF_ENDPOINT); Barge adds none. A revision is resolved to a
commit once (`HfApi.resolve_revision`, which also records the branch in the cache's
refs/), then only the files the model needs are fetched at that commit
(`snapshot_download` with `allow_patterns`): the config, the tokenizer, the safetensors
weights or one GGUF file, the sentence-transformers modules, a CTranslate2 Whisper's
model.bin. Offline, the same calls find the files in the cache or say why they cannot.

A submit needs no weights: the client may be a laptop, the workers GPU hosts that share
no disk with it. It pins the commit from the Hub's metadata alone (the revision's sha and
the commit's file listing, which also picks the GGUF file and so the routing key) and
fetches SUBMIT_FILES, the JSON configs validation reads (a few KB); each worker fetches
the weights at that commit before it claims a shard (queueing.runtime.fetch_model).
Offline there is no listing to ask: the files are those of this host's cached snapshot,
so an offline submit accepts only a model whose weights are cached here.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path

HUB_PREFIX = "hf://"
KEY_PREFIX = "hf."        # routing keys of Hub models: "hf.<org>--<name>[.<gguf stem>]@<commit>"

_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
_HUB_ID = re.compile(rf"(?P<repo>{_NAME}/{_NAME})(?::(?P<quant>[A-Za-z0-9_.-]+))?(?:@(?P<revision>[^\s:@]+))?"
                     rf"(?::(?P<quant_after>[A-Za-z0-9_.-]+))?")

# The files a model is made of, as huggingface_hub's allow_patterns (fnmatch: "*" also
# matches "/"). Everything else in a repo (pytorch_model.bin, ONNX, OpenVINO, TF, Flax,
# READMEs, other GGUF quantizations) is never downloaded.
CONFIG_FILES = ("config.json", "generation_config.json", "preprocessor_config.json", "tokenizer.json",
                "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.txt",
                "vocab.json", "merges.txt", "tokenizer.model", "*.tiktoken", "chat_template.jinja",
                "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
                "[0-9]_*/config.json", "[0-9]_*/*.safetensors", "vocabulary.txt", "vocabulary.json")
SAFETENSORS_FILES = ("model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json")
CT2_WHISPER_FILES = ("model.bin",)   # faster-whisper (CTranslate2) repos name their weights so
# What jobs.validate reads of a model at submit, out of CONFIG_FILES: the mode and width
# (config.json, modules.json), an FP8 checkpoint (config.json's quantization_config), a
# prompt and the pooling (engine.embed.config.load_encoder_config: the sentence-transformers
# configs, tokenizer_config.json's model_max_length). No tokenizer vocabulary, no weights:
# a GGUF repo needs nothing (its mode is its file's name; the header is read by workers).
SUBMIT_FILES = ("config.json", "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
                "[0-9]_*/config.json", "tokenizer_config.json")


@dataclass(frozen=True)
class HubId:
    repo_id: str                     # "org/name"
    revision: str | None = None      # branch, tag or commit; None: the repo's default branch
    quantization: str | None = None  # GGUF repos: which file, e.g. "Q4_1"

    def pinned(self, commit: str) -> str:
        """This id at one commit: what a job stores, so that every worker loads that commit."""
        return f"{self.repo_id}@{commit}" + (f":{self.quantization}" if self.quantization else "")


@dataclass(frozen=True)
class HubSnapshot:
    hub_id: HubId
    commit: str                  # the commit the revision resolved to
    folder: Path                 # snapshots/<commit> in the Hub cache
    gguf_file: str | None = None  # a GGUF model: its file in `folder`

    @property
    def path(self) -> str:
        return str(self.folder / self.gguf_file) if self.gguf_file else str(self.folder)

    @property
    def key(self) -> str:
        """The routing key: one queue per repo (and GGUF file), one engine per commit."""
        stem = f".{Path(self.gguf_file).stem}" if self.gguf_file else ""
        return f"{KEY_PREFIX}{self.hub_id.repo_id.replace('/', '--')}{stem}@{self.commit}"


def parse_hub_id(name: str) -> HubId | None:
    """The Hub id `name` spells, or None if it spells none; ValueError for a malformed
    `hf://` name (the prefix says it must be one)."""
    text = name.removeprefix(HUB_PREFIX)
    match = _HUB_ID.fullmatch(text)
    if match is None or (match["quant"] and match["quant_after"]):
        if name.startswith(HUB_PREFIX):
            raise ValueError(f"model: {name!r} is not a Hub id; expected hf://org/name[@revision][:quantization]")
        return None
    return HubId(match["repo"], match["revision"], match["quant"] or match["quant_after"])


def queue_key(model_key: str) -> str:
    """The part of a model key that names its queue: a Hub model's commit is left out, so
    a worker serving the repo takes the shards of every commit (fetching each before it
    claims a shard of it)."""
    return model_key.partition("@")[0] if model_key.startswith(KEY_PREFIX) else model_key


def is_hub_key(model_key: str) -> bool:
    return model_key.startswith(KEY_PREFIX) and "@" in model_key


def select_files(files: list[str], hub_id: HubId) -> tuple[list[str], str | None]:
    """The files to fetch out of a repo's (or a cached snapshot's) listing, and the GGUF
    file if the model is one. ValueError("model: ...") when the repo has no weights Barge
    loads, or when it is a GGUF repo with several quantizations and none (or an unknown
    one) is named."""
    name = f"{hub_id.repo_id}" + (f"@{hub_id.revision}" if hub_id.revision else "")
    ggufs = sorted(f for f in files if f.endswith(".gguf") and "/" not in f)
    configs = _matching(files, CONFIG_FILES)
    if hub_id.quantization:
        chosen = [f for f in ggufs if _quantization_of(f).lower() == hub_id.quantization.lower()]
        if len(chosen) != 1:
            raise ValueError(f"model: {name!r} has no GGUF file of quantization {hub_id.quantization!r} "
                             f"(it has: {_quantizations(ggufs)})")
        return configs + chosen, chosen[0]
    weights = _matching(files, SAFETENSORS_FILES) or _matching(files, CT2_WHISPER_FILES)
    if weights and "config.json" in files:
        return configs + weights, None
    if len(ggufs) == 1:
        return configs + ggufs, ggufs[0]
    if ggufs:
        raise ValueError(f"model: {name!r} holds several GGUF quantizations; name one as "
                         f"{hub_id.repo_id}:QUANT (it has: {_quantizations(ggufs)})")
    raise ValueError(f"model: {name!r} has no weights Barge loads (config.json with safetensors, a GGUF file, "
                     f"or a CTranslate2 Whisper model.bin); its files: {', '.join(sorted(files)[:12]) or 'none'}")


def _matching(files: list[str], patterns: tuple[str, ...]) -> list[str]:
    return [f for f in files if any(fnmatch.fnmatchcase(f, pattern) for pattern in patterns)]


def _quantization_of(gguf_file: str) -> str:
    """"SmolLM2-135M-Instruct.Q4_1.gguf" -> "Q4_1"; "model-q4_k_m.gguf" -> "q4_k_m"."""
    stem = Path(gguf_file).stem
    match = re.search(r"(?:^|[.-])((?:I?Q|BF|F)\d[A-Za-z0-9_]*)$", stem, flags=re.IGNORECASE)
    return match.group(1) if match else stem


def _quantizations(ggufs: list[str]) -> str:
    return ", ".join(_quantization_of(f) for f in ggufs) or "no GGUF files"


def fetch_snapshot(hub_id: HubId, *, weights: bool = True) -> HubSnapshot:
    """Resolve the id's revision to a commit and fetch (or find in the Hub cache) the
    files the model needs at that commit; with `weights=False` (a submit), only the
    SUBMIT_FILES among them. ValueError("model: ...") with the library's reason when it
    cannot: a wrong name, a private repo without a token, an unknown revision, offline
    and not cached."""
    import httpx2
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled,
                                        RevisionResolutionError)
    name = hub_id.repo_id + (f"@{hub_id.revision}" if hub_id.revision else "")
    api = HfApi()
    try:
        revision = api.resolve_revision(hub_id.repo_id, revision=hub_id.revision)
        files = _repo_files(api, hub_id.repo_id, revision.resolved)
        # Not cached and unreachable: snapshot_download says why (its own error, below).
        wanted, gguf_file = select_files(files, hub_id) if files is not None else (None, None)
        if wanted is not None and not weights:
            wanted = _matching(wanted, SUBMIT_FILES)
        if wanted == []:   # a GGUF repo at submit: nothing to fetch
            folder = _snapshot_folder(hub_id.repo_id, revision.resolved)
        else:
            folder = snapshot_download(hub_id.repo_id, revision=revision, allow_patterns=wanted)
    except (HfHubHTTPError, RevisionResolutionError, LocalEntryNotFoundError, OfflineModeIsEnabled,
            httpx2.TransportError) as exc:
        reason = " ".join(str(exc).split())
        raise ValueError(f"model: {name!r} cannot be fetched from the Hugging Face Hub "
                         f"({type(exc).__name__}): {reason}") from None
    return HubSnapshot(hub_id, revision.resolved, Path(folder), gguf_file)


def _repo_files(api, repo_id: str, commit: str) -> list[str] | None:
    """The commit's files: the Hub's listing, else (offline, or the Hub down) the cached
    snapshot's; None when neither is there."""
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled
    try:
        return api.list_repo_files(repo_id, revision=commit)
    except (OfflineModeIsEnabled, httpx2.TransportError):
        return _cached_files(repo_id, commit)
    except HfHubHTTPError as exc:
        if exc.response is None or exc.response.status_code < 500:
            raise
        return _cached_files(repo_id, commit)   # the Hub is down: the cache may do


def _cached_files(repo_id: str, commit: str) -> list[str] | None:
    """The files of a commit's snapshot in the Hub cache (the layout huggingface_hub
    writes: models--org--name/snapshots/<commit>/...), or None if it is not there."""
    folder = _snapshot_folder(repo_id, commit)
    if not folder.is_dir():
        return None
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _snapshot_folder(repo_id: str, commit: str) -> Path:
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name
    return Path(constants.HF_HUB_CACHE, repo_folder_name(repo_id=repo_id, repo_type="model"), "snapshots", commit)


# LoRA adapters by Hub id (jobs.adapters): a submit fetches an adapter's config and reads its
# weights' safetensors header alone (safetensors_shapes); a worker fetches the two files
# (engine.lora.adapter).


def hub_errors() -> tuple[type[Exception], ...]:
    """What huggingface_hub raises when a repo's file cannot be had or read: a wrong name, a
    private repo without a token, an unknown revision or file, offline and not cached, the Hub
    unreachable, a safetensors header that does not parse. A refusal quotes its type and message."""
    import httpx2
    from huggingface_hub.errors import (HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled,
                                        RevisionResolutionError, SafetensorsParsingError)
    return (HfHubHTTPError, RevisionResolutionError, LocalEntryNotFoundError, OfflineModeIsEnabled,
            SafetensorsParsingError, httpx2.TransportError)


def resolve_commit(hub_id: HubId) -> str:
    """The commit the id's revision names now: the Hub's metadata (HfApi.resolve_revision, which
    records a branch in the cache's refs/), or offline or with the Hub down those refs/; a
    commit is itself, asked of no one. One of hub_errors() when it cannot be resolved."""
    from huggingface_hub import HfApi
    return HfApi().resolve_revision(hub_id.repo_id, revision=hub_id.revision).resolved


def fetch_file(repo_id: str, commit: str, filename: str) -> Path:
    """One file at a commit, from the Hub cache or fetched into it (hf_hub_download)."""
    from huggingface_hub import hf_hub_download
    return Path(hf_hub_download(repo_id, filename, revision=commit))


def cached_file(repo_id: str, commit: str, filename: str) -> Path | None:
    """One file at a commit if the Hub cache holds it, else None; asks the Hub nothing."""
    from huggingface_hub import try_to_load_from_cache
    found = try_to_load_from_cache(repo_id, filename, revision=commit)
    return Path(found) if isinstance(found, str) else None


def safetensors_shapes(repo_id: str, commit: str, filename: str) -> dict[str, tuple[int, ...]]:
    """tensor name -> shape, from the header of a safetensors file on the Hub, read by a ranged
    GET of its first 100 kB (a second for a longer header: HfApi.parse_safetensors_file_metadata);
    nothing is cached, and the rest of the weights is never fetched."""
    from huggingface_hub import HfApi
    metadata = HfApi().parse_safetensors_file_metadata(repo_id, filename, revision=commit)
    return {name: tuple(info.shape) for name, info in metadata.tensors.items()}
