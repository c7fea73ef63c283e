"""tests.support.reference_cache: a reference's outputs are reused only for the same name,
inputs, weights (file size and time), libraries and source; anything else computes again,
and BARGE_TEST_REFERENCE_CACHE=0 computes every time."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tests.support.reference_cache import computed_once


@pytest.fixture
def weights(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("BARGE_TEST_REFERENCE_CACHE", raising=False)
    path = tmp_path / "model.bin"
    path.write_bytes(b"weights")
    return path


def counting():
    calls = []

    def compute():
        calls.append(1)
        return {"tokens": [len(calls), 7], "features": torch.arange(3.0)}
    return calls, compute


def test_the_same_key_is_computed_once_and_its_value_comes_back(weights):
    calls, compute = counting()
    inputs = {"clip": np.arange(5, dtype=np.float32), "text": "a barge"}
    first = computed_once("ref", compute, inputs=inputs, weights=weights, libraries=())
    again = computed_once("ref", compute, inputs=dict(inputs), weights=weights, libraries=())
    assert len(calls) == 1 and again["tokens"] == first["tokens"] == [1, 7]
    assert torch.equal(again["features"], first["features"])


def test_other_inputs_names_weights_or_sources_compute_again(weights, tmp_path):
    calls, compute = counting()
    base = dict(inputs=[np.zeros(4, np.float32), "x"], weights=weights, libraries=())
    computed_once("ref", compute, **base)
    computed_once("ref", compute, **{**base, "inputs": [np.ones(4, np.float32), "x"]})   # other bytes
    computed_once("ref", compute, **{**base, "inputs": [np.zeros(4, np.float64), "x"]})  # other dtype
    computed_once("other", compute, **base)
    source = tmp_path / "source.py"
    source.write_text("a = 1\n")
    computed_once("ref", compute, **base, sources=(source,))
    source.write_text("a = 2\n")
    computed_once("ref", compute, **base, sources=(source,))
    assert len(calls) == 6
    os.utime(weights, ns=(1, 1))         # the weights rewritten
    computed_once("ref", compute, **base)
    assert len(calls) == 7


def test_turned_off_it_computes_every_time_and_keeps_nothing(weights, tmp_path, monkeypatch):
    monkeypatch.setenv("BARGE_TEST_REFERENCE_CACHE", "0")
    calls, compute = counting()
    for _ in range(2):
        computed_once("ref", compute, inputs=[], weights=weights, libraries=())
    assert len(calls) == 2 and not (tmp_path / "cache").exists()


def test_an_input_it_cannot_key_is_refused(weights):
    with pytest.raises(TypeError, match="cannot key"):
        computed_once("ref", lambda: 1, inputs=[object()], weights=weights, libraries=())
