"""A Hugging Face Hub cache on disk, built from the weights the test extra installs, in
the layout huggingface_hub writes (and reads with HF_HUB_OFFLINE=1):

    HF_HOME/hub/models--org--name/
        blobs/<sha256 of an LFS file, git sha1 of another>   the files' bytes, once
        refs/<branch or tag>                                  a commit hash
        snapshots/<commit>/<path>                             symlinks into ../../blobs
        trees/<commit>.json                                   the commit's whole file listing

The tree listing also names files a real repo holds that Barge must not download
(pytorch_model.bin, ONNX, other GGUF quantizations): snapshot_download, offline, checks
that every file its allow_patterns select is in the snapshot, so a pattern that took
one of those would fail the tests.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

ORG = "barge-test"
MINILM = f"{ORG}/all-MiniLM-L6-v2"
SMOLLM2 = f"{ORG}/SmolLM2-135M-Instruct-GGUF"
WHISPER = f"{ORG}/faster-whisper-tiny.en"
NOT_DOWNLOADED = {"pytorch_model.bin": b"\0" * 64, "onnx/model.onnx": b"\0" * 32}
MINILM_SKIPPED = ("README.md", "data_config.json", ".gitattributes")   # Barge's allow_patterns leave these out


@dataclass
class HubCache:
    home: Path                                         # HF_HOME
    commits: dict[str, dict[str, str]] = field(default_factory=dict)   # repo -> ref -> commit

    @property
    def hub(self) -> Path:
        return self.home / "hub"

    def env(self) -> dict[str, str]:
        """huggingface_hub's own settings, offline."""
        return {"HF_HOME": str(self.home), "HF_HUB_OFFLINE": "1"}

    def snapshot(self, repo: str, ref: str) -> Path:
        return self.hub / _repo_folder(repo) / "snapshots" / self.commits[repo][ref]


def build_hub_cache(home: Path) -> HubCache:
    """MiniLM at three commits (main; branch `cls-pooling`, CLS instead of mean pooling;
    tag `v1.0-same-files`, the main commit's files exactly), SmolLM2's Q4_1 GGUF (the repo also
    lists a Q8_0 that is not cached), and Whisper tiny.en (CTranslate2)."""
    from jobs.models import registered_models
    packaged = registered_models({})
    cache = HubCache(home)
    minilm = Path(packaged["minilm"])
    main_files = {str(p.relative_to(minilm)): p for p in minilm.rglob("*") if p.is_file()
                  and str(p.relative_to(minilm)) not in MINILM_SKIPPED}
    pooling = json.loads((minilm / "1_Pooling" / "config.json").read_text())
    cls_pooling = {**pooling, "pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True}
    repo = _Repo(cache, MINILM)
    repo.commit("main", main_files, listed=[*MINILM_SKIPPED, *NOT_DOWNLOADED])
    repo.commit("cls-pooling", {**main_files, "1_Pooling/config.json": json.dumps(cls_pooling).encode()},
                listed=[*MINILM_SKIPPED, *NOT_DOWNLOADED])
    repo.commit("v1.0-same-files", main_files, listed=[*MINILM_SKIPPED, *NOT_DOWNLOADED])

    gguf = Path(packaged["smollm2"])
    _Repo(cache, SMOLLM2).commit("main", {gguf.name: gguf}, listed=["SmolLM2-135M-Instruct.Q8_0.gguf", "README.md"])

    whisper = Path(packaged["whisper-tiny.en"])
    _Repo(cache, WHISPER).commit("main", {p.name: p for p in whisper.iterdir() if p.is_file()}, listed=["README.md"])
    return cache


class _Repo:
    def __init__(self, cache: HubCache, repo_id: str):
        self.cache, self.repo_id = cache, repo_id
        self.folder = cache.hub / _repo_folder(repo_id)
        cache.commits[repo_id] = {}

    def commit(self, ref: str, files: dict[str, Path | bytes], listed: list[str] = ()) -> str:
        """A commit holding `files` (path in repo -> a file to take or its bytes), with `ref`
        pointing at it; `listed` are further files of the repo, in its tree only."""
        blob_ids = {name: self._blob(content) for name, content in sorted(files.items())}
        commit = hashlib.sha1(json.dumps([ref, sorted(blob_ids.items())]).encode()).hexdigest()
        snapshot = self.folder / "snapshots" / commit
        for name, (blob_id, _) in blob_ids.items():
            link = snapshot / name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(self.folder / "blobs" / blob_id, link.parent))
        (self.folder / "refs").mkdir(parents=True, exist_ok=True)
        (self.folder / "refs" / ref).write_text(commit)
        tree = {name: {"size": size, "blob_id": blob_id} for name, (blob_id, size) in blob_ids.items()}
        for name in listed:
            body = NOT_DOWNLOADED.get(name, name.encode())
            tree[name] = {"size": len(body), "blob_id": _git_blob_sha1(body)}
        (self.folder / "trees").mkdir(exist_ok=True)
        (self.folder / "trees" / f"{commit}.json").write_text(json.dumps({"format_version": 1, "files": tree}))
        self.cache.commits[self.repo_id][ref] = commit
        return commit

    def _blob(self, content: Path | bytes) -> tuple[str, int]:
        """The blob's name (sha256 for a large file, as LFS names it; git's sha1 else) and size."""
        data = content.read_bytes() if isinstance(content, Path) else content
        blob_id = hashlib.sha256(data).hexdigest() if len(data) > 10_000_000 else _git_blob_sha1(data)
        blob = self.folder / "blobs" / blob_id
        if not blob.exists():
            blob.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, Path):
                shutil.copyfile(content, blob)
            else:
                blob.write_bytes(data)
        return blob_id, len(data)


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _repo_folder(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")
