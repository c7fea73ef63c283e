"""A reference library a test module needs, skipped at collection where it is missing but
imported only when a test first uses it.

`pytest.importorskip` at a module's top imports the library while pytest collects, and make
test collects the whole suite in each of its processes: sentence-transformers alone costs
2.6 s of CPU there, paid seven times over for the few processes that run its tests."""

from __future__ import annotations

import importlib
import importlib.util

import pytest


class LazyModule:
    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attribute: str):
        return getattr(importlib.import_module(self._name), attribute)


def importorskip_lazily(name: str) -> LazyModule:
    """As pytest.importorskip(name) at a module's top, but the import waits for first use."""
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"could not import {name!r}", allow_module_level=True)
    return LazyModule(name)
