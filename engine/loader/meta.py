"""Modules built with no storage and no initialisation, for a checkpoint's tensors to be
assigned next (load_state_dict(assign=True)).

On the meta device a module's reset_parameters still runs, and torch's meta `normal_` (each
nn.Embedding's) goes through torch._refs, whose first call imports torch._dynamo: 2.9 s of
CPU in every process that loads an engine, for random numbers nobody reads (2-core AMX Xeon,
torch 2.13). The init functions do nothing while a model is built here, as transformers'
no_init_weights does; `without_init` alone skips them where a model is built for real and
loaded strictly (Whisper's, 1.1 s of CPU on random numbers for the base model). They are torch.nn.init's module globals, so a module built in another
thread meanwhile would not be initialised either; engines are loaded one at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

INIT_FUNCTIONS = ("uniform_", "normal_", "trunc_normal_", "constant_", "zeros_", "ones_", "xavier_uniform_",
                  "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")


@contextmanager
def without_init() -> Iterator[None]:
    """Parameters left as allocated: for a model whose every tensor is loaded next, strictly."""
    saved = {name: getattr(torch.nn.init, name) for name in INIT_FUNCTIONS}

    def skip(tensor, *args, **kwargs):
        return tensor

    try:
        for name in INIT_FUNCTIONS:
            setattr(torch.nn.init, name, skip)
        yield
    finally:
        for name, function in saved.items():
            setattr(torch.nn.init, name, function)


@contextmanager
def on_meta() -> Iterator[None]:
    with without_init(), torch.device("meta"):
        yield
