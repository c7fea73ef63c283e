"""Both ways an encoder's linears run on a CPU, whichever this CPU takes: oneDNN's packed,
fused linears (AVX-512) or MKL's sgemm on plain nn.Linear layers, GELU in place after it
(AVX2 alone). See engine/layers/linear.py."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from engine.layers import linear as linear_module
from engine.layers.packed_linear import HAS_BF16_PACKING

LINEAR_PATHS = ["onednn", "mkl"]
# bf16 on a CPU runs on oneDNN's bf16 linears (AVX-512 with BF16, or AMX); elsewhere the engine refuses it
bf16_linears = pytest.mark.skipif(not HAS_BF16_PACKING, reason="oneDNN has no bf16 linears on this CPU")


@contextlib.contextmanager
def linear_path(path: str) -> Iterator[str]:
    """Within it, linear_act / linear_residual and the embedder's loading act as they do on a
    CPU where oneDNN pays ("onednn") or one where it does not ("mkl")."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(linear_module, "ONEDNN_PAYS", path == "onednn")
        yield path
