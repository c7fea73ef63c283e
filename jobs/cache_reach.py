"""What one host may conclude about a results-cache file that the shared index names.

The index (jobs.cache_store) is shared by every host; the files it names may not be. A
path on a worker's own disk is a path no other host has, and there it raises exactly the
FileNotFoundError that a deleted file raises. So a host drops a file's entries only on
evidence that holds for every host:

    the file's URL                      what failed here                      then
    object store (s3://, gs://, ...)    no such object, or not Parquet       gone: its entries leave the index
    a path under BARGE_SHARED_PATHS     (the same everywhere)                 gone
    any path, one-host deployment       (there is no other host)              gone
    a path on this host's disk, in a    anything                              a miss for this host only:
      deployment of many hosts                                                the entries stay
    any URL                             permission, network, credentials      a miss for this host only

"Gone" also needs the place the file lies in to answer for itself: its bucket exists, or
on a disk the cache root two folders up (ROOT/namespace/file) does. A host pointed at
the wrong endpoint, or whose share is not mounted, sees every file missing, and must not
empty the index for the others.

The same rule decides what prune may forget: a file it cannot see is not removed, and
its index row stays for the host that holds it (jobs.retention).
"""

from __future__ import annotations

import enum
import logging
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa

from jobs.hosts import unshared
from jobs.settings import Settings
from storage.fs import is_object_store, resolve
from storage.redaction import redact_text, redact_url

log = logging.getLogger("barge.cache")


class Removal(enum.Enum):
    REMOVED = "removed"              # deleted through its URL (or, in a dry run, there to delete)
    GONE = "gone"                    # absent for every host (the rule above): its row may go
    OUT_OF_REACH = "out of reach"    # not visible or not deletable from this host: its row stays


@dataclass(frozen=True)
class CacheReach:
    """The rule above for one host: its deployment's settings and environment
    (BARGE_SINGLE_HOST, BARGE_SHARED_PATHS; os.environ when None)."""

    settings: Settings
    env: Mapping[str, str] | None = None

    def is_everyones(self, url: str) -> bool:
        """Whether every host sees at `url` what this host sees."""
        return unshared(url, self.settings, self.env) is None

    def is_gone(self, url: str, error: BaseException) -> bool:
        """Whether `error`, raised reading the cache file `url` here, shows it gone for every host."""
        if not self.is_everyones(url):
            return False
        if isinstance(error, pa.ArrowInvalid):   # it is there, and it is not the Parquet file we wrote
            return True
        return isinstance(error, FileNotFoundError) and _place_answers(url)

    def remove(self, url: str, *, dry_run: bool = False) -> Removal:
        """Delete the cache file `url` through its own URL, saying what became of it."""
        try:
            fs, path = resolve(url)
            fs.invalidate_cache(path)   # another process wrote or removed it: no listing of ours is news
            if fs.exists(path):
                if not dry_run:
                    fs.rm(path)
                return Removal.REMOVED
        except Exception as exc:  # noqa: BLE001 - refused, unreachable, no credentials here
            log.warning("cache file %s cannot be removed from this host: %s", redact_url(url), redact_text(str(exc)))
            return Removal.OUT_OF_REACH
        return Removal.GONE if self.is_gone(url, FileNotFoundError(url)) else Removal.OUT_OF_REACH


def _place_answers(url: str) -> bool:
    """Whether the bucket (object stores) or the cache root (ROOT/namespace/file) exists here."""
    try:
        fs, path = resolve(url)
        place = path.split("/", 1)[0] if is_object_store(fs) else posixpath.dirname(posixpath.dirname(path))
        fs.invalidate_cache(place)
        return bool(place) and fs.exists(place)
    except Exception:  # noqa: BLE001 - no answer is no evidence
        return False
