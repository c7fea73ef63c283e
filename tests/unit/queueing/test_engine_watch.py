"""The engine watchdog's rule (queueing.stall), on a clock the test moves: a busy thread
with no engine step for stall_s is stalled, a load or an engine's first call gets
load_stall_s, steps on another thread do not count, and a thread that is not in an
engine call is never stalled, however long it idles."""

from __future__ import annotations

import threading

from queueing.stall import EngineWatch


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeEngine:
    def __init__(self):
        self.observers = []

    def add_step_observer(self, observer) -> None:
        self.observers.append(observer)

    def step(self) -> None:
        for observer in self.observers:
            observer(None)


def test_a_call_without_steps_stalls_after_the_limit_and_steps_keep_it_alive():
    clock, engine = Clock(), FakeEngine()
    watch = EngineWatch(10, 100, clock=clock)
    watch.watch(engine)
    engine.step()   # the engine has made its first step: the short limit applies
    with watch.busy("embed of 256 rows", engine):
        for _ in range(5):
            clock.now += 9
            engine.step()
            assert watch.stalled() is None
        clock.now += 10.5
        reason = watch.stalled()
        assert reason is not None and "embed of 256 rows" in reason and "no engine step for 10 s" in reason
    assert watch.stalled() is None   # the call returned: nothing is busy


def test_loading_and_a_first_call_get_the_load_limit():
    clock, engine = Clock(), FakeEngine()
    watch = EngineWatch(10, 100, clock=clock)
    with watch.busy("loading minilm", loading=True):
        clock.now += 99
        assert watch.stalled() is None
        clock.now += 2
        assert "loading minilm" in watch.stalled()
    watch.watch(engine)
    with watch.busy("the first call", engine):   # kernels compile on the first step
        clock.now += 50
        assert watch.stalled() is None
        engine.step()
        clock.now += 11
        assert watch.stalled() is None   # its limit was set when it began
    with watch.busy("a later call", engine):
        clock.now += 11
        assert "a later call" in watch.stalled()


def test_idle_is_not_a_stall_and_another_threads_steps_do_not_count():
    clock, engine = Clock(), FakeEngine()
    watch = EngineWatch(10, 10, clock=clock)
    watch.watch(engine)
    clock.now += 10_000
    assert watch.stalled() is None   # no engine call: idle between shards
    inside = threading.Event()
    release = threading.Event()

    def hung_call():
        with watch.busy("a hung call", engine):
            inside.set()
            release.wait()

    thread = threading.Thread(target=hung_call)
    thread.start()
    inside.wait()
    clock.now += 11
    engine.step()   # a step on this thread (another engine call) says nothing about the hung one
    assert "a hung call" in watch.stalled()
    release.set()
    thread.join()
    assert watch.stalled() is None


def test_the_watchdog_thread_calls_on_stall_once_and_touches_the_progress_file_until_then(tmp_path):
    stalls = []
    progress = tmp_path / "engine.progress"
    watch = EngineWatch(0.2, 0.2, on_stall=stalls.append, progress_file=progress).start()
    for _ in range(50):
        if progress.exists():
            break
        threading.Event().wait(0.05)
    assert progress.exists() and not stalls   # healthy and idle: it says so
    with watch.busy("a hung call"):
        for _ in range(60):
            if stalls:
                break
            threading.Event().wait(0.05)
    assert len(stalls) == 1 and "a hung call" in stalls[0]
    watch.stop()
