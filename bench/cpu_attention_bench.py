"""The embedders' attention on a CPU: Barge's C++ varlen kernel beside PyTorch's SDPA, same process.

    .venv/bin/python bench/cpu_attention_bench.py
    .venv/bin/python bench/cpu_attention_bench.py --heads 12 --head-dim 32 --tokens 2048

One packed batch of `--tokens` tokens of texts all of one length (the batch an embedder
forms from a shard sorted by length), q, k and v as views of one fused projection, as
the BERT encoder has them. SDPA takes the texts as one [texts, heads, length, head_dim]
call (what engine/layers/attention.py does per run of equal-length texts); the kernel
takes the whole batch and its cu_seqlens. Prints best-of milliseconds for each, their
ratio and the kernel's GFLOP/s (Q·Kᵀ and P·V), and the largest difference between the two.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from engine.kernels import cpu_ops  # noqa: E402


def best_ms(fn, seconds: float = 2.0) -> float:
    fn()
    best, deadline = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--lengths", default="8,16,40,70,128,256")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    if not cpu_ops.cpu_kernels_available():
        sys.exit("the CPU kernels could not be built here (see the log above); nothing to compare")
    torch.set_num_threads(args.threads)
    heads, head_dim = args.heads, args.head_dim
    print(f"{args.tokens} tokens per batch, {heads} heads of {head_dim}, {args.threads} threads, "
          f"torch {torch.__version__}")
    for length in (int(x) for x in args.lengths.split(",")):
        texts = max(1, args.tokens // length)
        torch.manual_seed(0)
        qkv = torch.randn(texts * length, 3 * heads * head_dim)
        q, k, v = qkv.view(-1, 3, heads, head_dim).unbind(1)
        cu_seqlens = torch.arange(texts + 1) * length
        grouped = qkv.view(texts, length, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
        kernel = lambda: cpu_ops.varlen_attention(q, k, v, cu_seqlens, head_dim ** -0.5)  # noqa: E731
        sdpa = lambda: F.scaled_dot_product_attention(*grouped)  # noqa: E731
        difference = (kernel() - sdpa().transpose(1, 2).reshape(-1, heads, head_dim)).abs().max().item()
        kernel_ms, sdpa_ms = best_ms(kernel), best_ms(sdpa)
        flops = 4 * texts * heads * length * length * head_dim
        print(f"  texts of {length:>4} tokens ({texts:>4}): kernel {kernel_ms:6.2f} ms "
              f"({flops / kernel_ms / 1e6:5.1f} GFLOP/s), SDPA {sdpa_ms:6.2f} ms: {sdpa_ms / kernel_ms:4.2f}x; "
              f"max difference {difference:.1e}")


if __name__ == "__main__":
    main()
