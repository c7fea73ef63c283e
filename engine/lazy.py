"""Package names loaded on first use (PEP 562), for engine/__init__ and engine/generate/__init__:
importing a torch-free module of the engine (engine.generate.structured) must not load the
model code and torch through its packages' __init__."""

from __future__ import annotations

import importlib
import sys
from typing import Callable


def lazy_names(package: str, where: dict[str, str]) -> Callable[[str], object]:
    """A module `__getattr__` that imports `where[name]` (a module) when `name` is first asked
    of `package`, and keeps the value on the package."""
    def __getattr__(name: str) -> object:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        setattr(sys.modules[package], name, value)
        return value
    return __getattr__
