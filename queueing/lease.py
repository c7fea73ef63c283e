"""A worker's hold on the shard it runs: renewed in the background, checked between
engine calls, so a cancelled, expired or reclaimed shard stops within seconds."""

from __future__ import annotations

import logging
import threading

from jobs.store import Store

log = logging.getLogger("barge.worker")


class LeaseKeeper:
    """Renews the lease every `lease_s / 4` (at most every 2 s, so losing the claim is
    noticed quickly) until closed; `is_lost` turns True once a renewal is refused."""

    def __init__(self, store: Store, job_id: str, shard_index: int, token: str, lease_s: float):
        self.store = store
        self.job_id = job_id
        self.shard_index = shard_index
        self.token = token
        self.lease_s = lease_s
        self.interval_s = min(lease_s / 4, 2.0)
        self._lost = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="barge-lease", daemon=True)

    def start(self) -> "LeaseKeeper":
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop renewing (the shard ended: committed, released, failed or lost). Idempotent."""
        self._closed.set()
        if self._thread.is_alive():
            self._thread.join()

    def __enter__(self) -> "LeaseKeeper":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def is_lost(self) -> bool:
        return self._lost.is_set()

    def _run(self) -> None:
        while not self._closed.wait(self.interval_s):
            try:
                if not self.store.renew_lease(self.job_id, self.shard_index, self.token, self.lease_s):
                    log.info("job %s shard %d: claim lost (cancelled, expired or reclaimed)",
                             self.job_id, self.shard_index)
                    self._lost.set()
                    return
            except Exception:   # a database blip: try again next round; the lease has slack
                log.exception("job %s shard %d: lease renewal failed", self.job_id, self.shard_index)
