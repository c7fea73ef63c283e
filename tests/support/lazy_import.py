"""A reference library a test module needs, skipped at collection where it is missing but
imported only when a test first uses it.

`pytest.importorskip` at a module's top imports the library while pytest collects, and make
test collects the whole suite in each of its processes: sentence-transformers alone costs
2.6 s of CPU there, paid seven times over for the few processes that run its tests. (Until 2026-12-07 it was
paid anyway: pytest's probes of each module-level name imported the library.)"""

from __future__ import annotations

import importlib
import importlib.util

import pytest


class LazyModule:
    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attribute: str):
        # pytest probes every name in a test module while it collects (`__test__`,
        # `__wrapped__`, `_mock_name`, `__bases__`): a private name never imports
        if attribute.startswith("_"):
            raise AttributeError(attribute)
        return getattr(importlib.import_module(self._name), attribute)


def importorskip_lazily(name: str) -> LazyModule:
    """As pytest.importorskip(name) at a module's top, but the import waits for first use."""
    # find_spec of a dotted name imports its parents: look up the top-level package only
    if importlib.util.find_spec(name.partition(".")[0]) is None:
        pytest.skip(f"could not import {name!r}", allow_module_level=True)
    return LazyModule(name)
