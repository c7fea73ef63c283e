"""`barge models pull NAME...` and `barge models list`: what a worker can load.

`pull` fetches a Hub model, weights and all, into huggingface_hub's cache (HF_HOME) the
way a worker does before it claims a shard (a submit fetches only its configs), so that
an air-gapped worker (HF_HUB_OFFLINE=1) finds it there; for a registered name or a
folder it only checks the model. `list` shows the registered models and every revision
of every model in the Hub cache, with the refs that point at it (mode "-": a revision
that cannot be loaded from here, e.g. a submit's configs without the weights).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jobs.hub_models import HubId, select_files


def add_commands(commands: argparse._SubParsersAction) -> None:
    models = commands.add_parser("models", help="pull Hub models into the cache; list cached and registered models")
    actions = models.add_subparsers(required=True, metavar="ACTION")
    pull = actions.add_parser("pull", help="fetch models (org/name[@revision][:quant]) into the Hub cache")
    pull.add_argument("names", nargs="+", metavar="NAME")
    pull.set_defaults(func=_pull)
    listing = actions.add_parser("list", help="registered models, those workers announced, and the Hub cache's")
    listing.set_defaults(func=_list)


def _pull(args) -> int:
    from jobs.models import model_modes, resolve_model
    status = 0
    for name in args.names:
        try:
            ref = resolve_model(name)
        except ValueError as exc:
            print(f"barge: {exc}", file=sys.stderr)
            status = 2
            continue
        commit = f" at {ref.pinned.partition('@')[2]}" if ref.pinned else ""
        first, *also = model_modes(ref.path)
        modes = f"{first} model" + (f" (also {', '.join(also)})" if also else "")
        print(f"{name}{commit}: {modes}, {_size(ref.path)} in {ref.path}")
    return status


def _list(args) -> int:
    from jobs.models import model_modes, registered_models
    print("registered models:")
    for name, path in sorted(registered_models().items()):
        print(f"  {name:<28} {_mode_of(model_modes, path):<20} {path}")
    _list_cards()
    from huggingface_hub import constants, scan_cache_dir
    from huggingface_hub.errors import CacheNotFound
    try:
        cache = scan_cache_dir()
    except CacheNotFound:
        print(f"Hub cache: none at {constants.HF_HUB_CACHE}")
        return 0
    print(f"Hub cache ({constants.HF_HUB_CACHE}):")
    for repo in sorted((r for r in cache.repos if r.repo_type == "model"), key=lambda r: r.repo_id):
        for revision in sorted(repo.revisions, key=lambda r: r.commit_hash):
            refs = ",".join(sorted(revision.refs)) or "-"
            path = _model_path(repo.repo_id, revision)
            mode = _mode_of(model_modes, path) if path else "-"
            print(f"  {repo.repo_id + '@' + revision.commit_hash[:12]:<52} {refs:<20} {mode:<20} "
                  f"{revision.size_on_disk_str:>9}")
    return 0


def _model_path(repo_id: str, revision) -> str | None:
    """The cached revision as Barge would load it offline (a GGUF repo: its one cached file)."""
    files = [str(Path(f.file_path).relative_to(revision.snapshot_path)) for f in revision.files]
    try:
        _, gguf_file = select_files(files, HubId(repo_id))
    except ValueError:
        return None
    return str(revision.snapshot_path / gguf_file) if gguf_file else str(revision.snapshot_path)


def _list_cards() -> None:
    """The names workers announced to the store (jobs.model_cards): what a submit here can
    name without holding the model."""
    import time

    from jobs.model_cards import list_cards
    from jobs.settings import Settings
    from jobs.store import Store
    store = Store(Settings.from_env().database_url)
    store.migrate()
    cards = list_cards(store.engine)
    print("announced by workers:" if cards else "announced by workers: none")
    for card in cards:
        print(f"  {card.name:<28} key {card.key:<28} by {card.announced_by} {time.time() - card.announced_at:.0f} s ago")


def _mode_of(model_modes, path: str) -> str:
    from jobs.models import is_model
    if not is_model(path):   # model_modes knows a .gguf by its name alone
        return "-"
    try:
        return ",".join(model_modes(path))
    except (OSError, ValueError):
        return "-"


def _size(path: str) -> str:
    root = Path(path)
    files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
    return f"{len(files)} file{'s' * (len(files) != 1)}, {sum(p.stat().st_size for p in files) / 2**20:.1f} MiB"
