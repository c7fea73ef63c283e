"""Which dot precision a Triton kernel uses for an input dtype (shared by the kernels here)."""

from __future__ import annotations

import os

import torch


def dot_in_fp32(dtype: torch.dtype) -> bool:
    # fp32 inputs dot in fp32. bf16 ones too under TRITON_INTERPRET=1: Triton 3.9's
    # interpreter gets tl.dot on bfloat16 operands wrong (errors ~1e10 on a 16x16 product,
    # fp16 and fp8 are right), so interpreted tests check the bf16 path with an fp32 dot.
    return dtype == torch.float32 or (dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1")
