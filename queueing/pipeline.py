"""The shard pipeline: the engine never idles between shards.

Without it a worker runs claim → read → infer → write → commit for one shard, then
waits for the broker's next message, then claims and reads again, while the engine
(the GPU) sits idle. With it, the run_shard task only claims and reads (and looks rows
up in the results cache), hands the shard to the pipeline and returns, so the worker
takes the next message while the engine thread computes:

    task thread     claim+read A ─▶ submit A │ claim+read B ─▶ submit B (waits: depth) │ …
    engine thread                  infer A ──────────────── infer A⁺B ── infer B ──────
    commit thread                                           write+commit A      write+commit B

The engine thread fills each call with up to `chunk_rows` rows: when the current
shard's last rows do not fill a call, rows of the next shard of the same job top it up,
so the batch stays full across the boundary. Each shard is written and committed, on
its own thread, as soon as its own last row is done. At most `depth` shards wait
behind the one being computed (the task blocks until one finishes), so a worker never
hoards shards that an idle worker could take.

Generate rows do not go in calls of `chunk_rows`: a call would end with its longest
outputs decoding alone. They are requests of one continuously batched engine that the
pipeline keeps stepping and topping up from the shards in order (queueing.generate_feed),
so the batch stays full across shard boundaries.

Between engine calls (for generate, between steps) every shard in the pipeline is
checked as in the synchronous path: a lost claim ends that shard (and aborts its
requests); past the drain deadline every shard is released.

NOTE: a worker that dies takes every shard it holds with it, and each loses an
attempt. So that a poisoned shard (one that crashes the process) cannot use up the
attempts of the innocent shard held beside it, a shard on its second or later attempt
runs alone: the task waits for the pipeline to empty before reading it, then runs it
start to finish itself, taking no next message meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from jobs.failpoints import hang_if_poisoned
from jobs.logs import log_context
from queueing.generate_feed import GenerateFeed
from queueing.runtime import EngineKey, Runtime
from queueing.worker import (AttemptStopped, ShardOutcome, ShardWork, check_still_held, end_failed, end_shard,
                             end_stopped, infer_rows)

log = logging.getLogger("barge.worker")


class ShardPipeline:
    def __init__(self, runtime: Runtime, depth: int = 1):
        self.runtime = runtime
        self.depth = depth                      # shards that may wait behind the one computing
        self._works: list[ShardWork] = []       # in arrival order; the first ones are computing
        self._cond = threading.Condition()
        self._closed = False
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="barge-commit")
        self._pending_commits = 0
        self._feed: GenerateFeed | None = None   # generate shards' requests (queueing.generate_feed)
        self._thread = threading.Thread(target=self._run, name="barge-engine", daemon=True)
        self._thread.start()

    def submit(self, work: ShardWork) -> None:
        """Queue a begun shard; blocks while `depth` shards already wait."""
        self.runtime.metrics.in_progress.inc()
        if work.is_done:   # every row came from the cache: nothing for the engine
            self._end(work, lambda: end_shard(self.runtime, work))
            return
        with self._cond:
            while sum(not w.is_fed for w in self._works) > self.depth and not self._closed:
                self._cond.wait()
            self._works.append(work)
            self._cond.notify_all()

    def wait_idle(self) -> None:
        """Until every shard in the pipeline is committed, released or failed."""
        with self._cond:
            while self._works or self._pending_commits:
                self._cond.wait(0.2)

    @property
    def num_shards(self) -> int:
        with self._cond:
            return len(self._works) + self._pending_commits

    def close(self, timeout_s: float | None = None) -> None:
        """Wait until every shard in the pipeline is committed or released (a draining
        worker releases them at its deadline), then stop the threads."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while (self._works or self._pending_commits) and (deadline is None or time.monotonic() < deadline):
                self._cond.wait(0.2)
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)
        self._committer.shutdown(wait=True)

    def _run(self) -> None:
        while True:
            try:
                if not self._step():
                    return
            except Exception:   # never let the engine thread die with shards inside
                log.exception("pipeline step failed")
                time.sleep(1.0)

    def _step(self) -> bool:
        """One engine call (a generate step); False once closed and empty."""
        with self._cond:
            while not (self._feed and self._feed.num_requests) and all(w.is_fed for w in self._works):
                if self._closed and not self._works:
                    return False
                self._cond.wait(0.5)
            stopped = self._end_stopped()
            feed = self._feed_for_next()
            if feed is None:
                batch = [] if stopped else self._next_batch()
            else:
                additions = self._take_for_feed(feed)
        if feed is None:
            if batch:
                self._infer(batch)
            return True
        for work in stopped:
            feed.abort(work)
        self._feed_step(feed, additions)
        return True

    def _infer(self, batch: list[tuple[ShardWork, list[int]]]) -> None:
        try:
            infer_rows(self.runtime, batch)
        except Exception as exc:   # the engine failed on these rows: their shards fail
            self._fail(list({id(w): w for w, _ in batch}.values()), exc)
            return
        for work, _ in batch:
            if work.is_done and self._remove(work):
                self._end(work, lambda w=work: end_shard(self.runtime, w))

    def _next_batch(self) -> list[tuple[ShardWork, list[int]]]:
        """Under the lock: up to chunk_rows rows from the first unfed shards of one job."""
        batch, room = [], self.runtime.options.chunk_rows
        for work in self._works:
            if work.is_fed:
                continue
            if batch and (not work.can_share_batch(batch[0][0]) or room == 0):
                break
            rows = work.take(room)
            batch.append((work, rows))
            room -= len(rows)
        return batch

    def _feed_for_next(self) -> GenerateFeed | None:
        """Under the lock: the generate feed if it has requests or the next unfed shard is
        a generate shard (made for that shard's model if need be); else None."""
        if self._feed is not None and self._feed.num_requests:
            return self._feed
        work = next((w for w in self._works if not w.is_fed), None)
        if work is None or work.job.spec.mode != "generate":
            return None
        if self._feed is None or not self._feed.serves(work):
            key = EngineKey.for_job(work.job)
            self._feed = GenerateFeed(self.runtime.engine_for(key), key)
        return self._feed

    def _take_for_feed(self, feed: GenerateFeed) -> list[tuple[ShardWork, list[int], int]]:
        """Under the lock: rows of the unfed shards, in order, that the feed wants now;
        each with the todo index of its first row. Stops at a shard the feed does not
        serve, which runs once the feed has drained."""
        additions, room = [], feed.wants_rows
        for work in self._works:
            if room == 0:
                break
            if work.is_fed:
                continue
            if not feed.serves(work):
                break
            first_index = work.fed
            rows = work.take(room)
            additions.append((work, rows, first_index))
            room -= len(rows)
        if additions:
            self._cond.notify_all()   # fed shards make room for the task thread's next one
        return additions

    def _feed_step(self, feed: GenerateFeed, additions: list[tuple[ShardWork, list[int], int]]) -> None:
        """Add the rows, then one engine step; commit the shards it completed."""
        touched = {}
        for work, rows, first_index in additions:
            try:
                feed.add(work, rows, first_index)
            except Exception as exc:   # e.g. sampling params the engine refuses: this shard fails
                feed.abort(work)
                self._fail([work], exc)
            else:
                touched[id(work)] = work
        try:
            if feed.num_requests:
                with self.runtime.watch.busy(f"a generate step of {feed.key.model_key} ({feed.num_requests} requests)",
                                             feed.engine):
                    hang_if_poisoned([work.inputs[row] for work, rows, _ in additions for row in rows])
                    touched.update((id(work), work) for work in feed.step())
        except Exception as exc:   # the engine failed: every shard with rows in it fails
            self._fail(feed.abort_all(), exc)
            return
        for work in touched.values():
            if work.is_done and self._remove(work):
                self._end(work, lambda w=work: end_shard(self.runtime, w))

    def _fail(self, works: list[ShardWork], exc: Exception) -> None:
        for work in works:
            if self._remove(work):
                self._end(work, lambda w=work, e=exc: end_failed(self.runtime, w, e))

    def _end_stopped(self) -> list[ShardWork]:
        """Under the lock: end the shards whose claim is gone, or all when past the drain
        deadline; the shards it ended."""
        stopped = []
        for work in list(self._works):
            try:
                check_still_held(self.runtime, work)
            except AttemptStopped as stop:
                stopped.append((work, stop.reason))
        for work, reason in stopped:
            self._works.remove(work)
            self._end(work, lambda w=work, r=reason: end_stopped(self.runtime, w, r))
        if stopped:
            self._cond.notify_all()
        return [work for work, _ in stopped]

    def _remove(self, work: ShardWork) -> bool:
        with self._cond:
            if work not in self._works:
                return False
            self._works.remove(work)
            self._cond.notify_all()
            return True

    def _end(self, work: ShardWork, step) -> None:
        """Run the shard's last step (commit, release or failure) on the commit thread."""
        with self._cond:   # re-entrant: callers may hold it
            self._pending_commits += 1
        self._committer.submit(self._finish, work, step)

    def _finish(self, work: ShardWork, step) -> None:
        metrics = self.runtime.metrics
        with log_context(job_id=work.job.id, shard_id=work.shard_index):
            try:
                outcome: ShardOutcome = step()
            except Exception:   # a database blip at commit: the lease expires, another attempt follows
                log.exception("ending the shard failed")
                outcome = ShardOutcome("lost")
            metrics.shard_attempts.labels(outcome.status).inc()
            if outcome.usage is not None:
                metrics.shard_committed(outcome.usage, time.monotonic() - work.started_at)
            metrics.in_progress.dec()
            log.info("shard %s: %d rows, %d failed", outcome.status, outcome.num_rows, outcome.rows_failed)
        with self._cond:
            self._pending_commits -= 1
            self._cond.notify_all()
