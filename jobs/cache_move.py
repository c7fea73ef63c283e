"""A host-local results cache moved to a URL every host reads (`barge cache move`).

Run on the host that holds the files. Each indexed file under SOURCE moves on its own:

    copy    SOURCE/ns/name -> TARGET/ns/name   whole or not at all (storage.write)
    point   the file's index row at the copy: one UPDATE, only while the row still names
            the original (pruned or moved meanwhile: the copy goes, nothing else changes)
    remove  the original, only once the index names the copy

Stopped anywhere, each file's entries name either the original or the copy, and both
are whole. Run again, a file not yet pointed is copied again (the same bytes), and
SOURCE is swept for originals whose copy the index already names (stopped between
point and remove). A file indexed under SOURCE that this host does not have is another
host's: it is left as it is, and listed, for a move run on that host.
"""

from __future__ import annotations

import logging
import posixpath
from dataclasses import dataclass, field

from jobs.cache_store import CacheFile
from jobs.store import Store
from storage.fs import describe, join, resolve, to_url
from storage.redaction import redact_url
from storage.write import write_bytes_atomic

log = logging.getLogger("barge.cache")


@dataclass
class MoveReport:
    dry_run: bool
    target: str
    moved: list[str] = field(default_factory=list)       # originals now at TARGET (or, dry run, to move)
    elsewhere: list[str] = field(default_factory=list)   # indexed under SOURCE, not on this host: untouched
    failed: list[tuple[str, str]] = field(default_factory=list)   # (original, why): still indexed as it was
    swept: list[str] = field(default_factory=list)       # originals an earlier, stopped move had copied

    def lines(self) -> list[str]:
        verb = "would move" if self.dry_run else "moved"
        return ([f"{verb} {redact_url(url)}" for url in self.moved]
                + [f"{'would remove' if self.dry_run else 'removed'} {redact_url(url)}: its copy is indexed "
                   "already" for url in self.swept]
                + [f"not on this host: {redact_url(url)} (run `barge cache move` on the host that holds it)"
                   for url in self.elsewhere]
                + [f"not moved: {redact_url(url)}: {why}" for url, why in self.failed]
                + [f"{verb} {len(self.moved)} cache files to {redact_url(self.target)}; {len(self.elsewhere)} on "
                   f"other hosts, {len(self.failed)} failed",
                   f"set BARGE_CACHE_URL={redact_url(self.target)} on every worker, so that new results go there"])


def move_cache(store: Store, source: str, target: str, *, dry_run: bool = False) -> MoveReport:
    """Move the indexed cache files under `source` (this host's folder) to `target`."""
    source_root, target_root = _canonical(source), _canonical(target)
    if _is_under(target_root, source_root) or _is_under(source_root, target_root):
        raise ValueError(f"cache move: {redact_url(target)} and {redact_url(source)} overlap; "
                         "move to a folder outside the cache")
    report = MoveReport(dry_run=dry_run, target=target)
    for file in store.cache_files():
        if _is_under(_canonical(file.url), source_root):
            _move_file(store, file, target, report)
    _sweep(store, source, target, report)
    return report


def _move_file(store: Store, file: CacheFile, target: str, report: MoveReport) -> None:
    folder, name = join(target, file.namespace), posixpath.basename(file.url)
    copy_url = join(folder, name)
    try:
        fs, path = resolve(file.url)
        data = fs.cat_file(path)   # a shard attempt's computed rows: megabytes, held once
    except FileNotFoundError:
        report.elsewhere.append(file.url)
        return
    except Exception as exc:  # noqa: BLE001 - unreadable here: reported, left as it is
        report.failed.append((file.url, describe(exc)))
        return
    if report.dry_run:
        report.moved.append(file.url)
        return
    try:
        write_bytes_atomic(folder, name, data)
    except Exception as exc:  # noqa: BLE001 - the index still names the original
        report.failed.append((file.url, describe(exc)))
        return
    if not store.cache_move_file(file.id, file.url, copy_url):
        log.info("cache file %s was pruned or moved meanwhile; its copy is not needed", redact_url(file.url))
        _remove_unindexed(store, copy_url)
        return
    report.moved.append(file.url)
    _remove(file.url)


def _sweep(store: Store, source: str, target: str, report: MoveReport) -> None:
    """Originals left by a move stopped between point and remove: files SOURCE/ns/name
    that the index no longer names, while it names TARGET/ns/name."""
    fs, root = resolve(source)
    originals = [to_url(fs, path) for path in fs.glob(join(root, "*/*.parquet"))]
    copies = {url: join(join(target, posixpath.basename(posixpath.dirname(url))), posixpath.basename(url))
              for url in originals}
    indexed = store.cache_indexed_urls(originals + list(copies.values()))
    for url in originals:
        if copies[url] in indexed and url not in indexed and url not in report.moved:
            report.swept.append(url)
            if not report.dry_run:
                _remove(url)


def _remove(url: str) -> None:
    """The original of an indexed copy: left behind when it cannot go, for the next sweep."""
    try:
        fs, path = resolve(url)
        fs.rm(path)
    except Exception as exc:  # noqa: BLE001 - the index names the copy: nothing depends on this file
        log.warning("cache file %s was moved but cannot be removed: %s", redact_url(url), describe(exc))


def _remove_unindexed(store: Store, url: str) -> None:
    if url not in store.cache_indexed_urls([url]):   # another move may have pointed its row at this very copy
        _remove(url)


def _canonical(url: str) -> str:
    """One spelling per location: local paths absolute, URLs as fsspec writes them."""
    fs, path = resolve(url)
    return to_url(fs, path).rstrip("/")


def _is_under(url: str, root: str) -> bool:
    return url == root or url.startswith(root + "/")
