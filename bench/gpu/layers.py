"""Issue 21's micro-benchmarks of one decoder layer's small ops and of the sampler, each
beside its peer in the same run:

  1. the ops between a layer's matmuls (residual adds, two RMSNorms, rotary of q and k,
     SiLU-and-multiply) as today's PyTorch ops against engine/kernels/fused_ops.py, at the
     1B and 8B Llama shapes for 1, 64 and 256 tokens: kernel launches per layer (counted by
     torch.profiler) and time per layer.
  2. the sampler's time per step at batch 1, 64 and 256 with mixed params (greedy, seeded,
     temperature, top-k, top-p, logprobs) over a 128,256-token vocabulary, against the
     per-row sampler it replaced (copied below as the peer: per-request CPU generators).

    python bench/gpu/layers.py          # on a GPU, bf16, well under a minute
    python bench/gpu/layers.py --cpu    # here: tiny shapes, the kernels in Triton's interpreter

NOTE: on CPU the fused path runs in Triton's interpreter, so its times there say nothing
about either device; the CPU run exercises the script. Nothing is asserted: speed is read,
not tested.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(os.environ.get("BARGE_ROOT", Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")     # before triton's first import

import torch.nn.functional as F  # noqa: E402

from engine.generate.request import Request  # noqa: E402
from engine.generate.rotary import apply_rotary  # noqa: E402
from engine.generate.sampler import Sampler, top_logprobs  # noqa: E402
from engine.generate.sampling_params import SamplingParams  # noqa: E402
from engine.kernels import fused_ops  # noqa: E402
from engine.models.llama import RMSNorm  # noqa: E402


@dataclass(frozen=True)
class LayerShape:
    name: str
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int


SHAPES = [LayerShape("1B", 2048, 32, 8, 64, 8192), LayerShape("8B", 4096, 32, 8, 128, 14336)]
TINY = [LayerShape("tiny", 64, 4, 2, 16, 128)]


class PerRowSampler:
    """The sampler before issue 21, as it was (its per-request generators kept here, since
    Request no longer carries one): the peer."""

    def __init__(self, seed: int = 0):
        self.generator = torch.Generator().manual_seed(seed)
        self.generators: dict[int, torch.Generator] = {}

    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> tuple[list[int], list[dict | None]]:
        token_ids = logits.argmax(dim=-1)
        random_rows = [row for row, request in enumerate(requests) if not request.params.is_greedy]
        if random_rows:
            token_ids[random_rows] = self._draw(logits[random_rows], [requests[row] for row in random_rows])
        chosen = token_ids.tolist()
        logprobs = [None] * len(requests)
        asking = [row for row, request in enumerate(requests) if request.params.logprobs is not None]
        if asking:
            num_top = max(requests[row].params.logprobs for row in asking)
            scored = top_logprobs(logits[asking], [chosen[row] for row in asking], num_top)
            for row, entry in zip(asking, scored):
                logprobs[row] = entry
        return chosen, logprobs

    def _generator(self, request: Request) -> torch.Generator:
        if request.params.seed is None:
            return self.generator
        if request.request_id not in self.generators:
            self.generators[request.request_id] = torch.Generator().manual_seed(request.params.seed)
        return self.generators[request.request_id]

    def _draw(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        temperatures = torch.tensor([r.params.temperature for r in requests], dtype=logits.dtype, device=logits.device)
        logits = logits / temperatures[:, None]
        if any(r.params.top_k is not None or r.params.top_p < 1.0 for r in requests):
            logits = _top_k_top_p(logits, requests)
        probs = logits.softmax(dim=-1)
        noise = torch.empty(probs.shape)
        for row, request in enumerate(requests):
            noise[row].exponential_(generator=self._generator(request))
        return (probs / noise.to(probs.device)).argmax(dim=-1)


def _top_k_top_p(logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
    vocab = logits.shape[-1]
    top_k = torch.tensor([min(r.params.top_k or vocab, vocab) for r in requests], device=logits.device)
    top_p = torch.tensor([r.params.top_p for r in requests], dtype=logits.dtype, device=logits.device)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    outside = ranks >= top_k[:, None]
    probs = sorted_logits.masked_fill(outside, float("-inf")).softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    outside |= mass_before >= top_p[:, None]
    return logits.scatter(-1, order, sorted_logits.masked_fill(outside, float("-inf")))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_per_call(function, device: torch.device, repeats: int) -> float:
    """Median seconds per call over `repeats` calls, after two warm-up calls."""
    for _ in range(2):
        function()
    times = []
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        function()
        synchronize(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def count_kernels(function, device: torch.device) -> int | None:
    """CUDA kernels one call launches, by torch.profiler; None on CPU (no kernels to count)."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile
    function()
    synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        function()
        synchronize(device)
    return sum(1 for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA)


def layer_ops(shape: LayerShape, num_tokens: int, dtype: torch.dtype, device: torch.device):
    """The two ways to run one layer's small ops, on the same inputs (matmul outputs stand in
    for the matmuls and attention, which both paths share)."""
    generator = torch.Generator().manual_seed(0)

    def randn(*size):
        return torch.randn(*size, generator=generator).to(device, dtype)

    qkv_width = (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim
    residual, attended, mlp_out = randn(num_tokens, shape.hidden_size), randn(num_tokens, shape.hidden_size), \
        randn(num_tokens, shape.hidden_size)
    qkv, gate_up = randn(num_tokens, qkv_width), randn(num_tokens, 2 * shape.intermediate_size)
    norm1, norm2 = (RMSNorm(shape.hidden_size, 1e-5).to(device, dtype) for _ in range(2))
    angles = torch.rand(num_tokens, 1, shape.head_dim, generator=generator).to(device)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    q_size, kv_size = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim

    def pytorch():      # DecoderLayer.forward, its matmuls and attention left out
        hidden = residual + mlp_out
        normed = norm1(hidden)
        q, k, _ = qkv.split([q_size, kv_size, kv_size], dim=-1)
        apply_rotary(q.view(num_tokens, -1, shape.head_dim), k.view(num_tokens, -1, shape.head_dim), cos, sin)
        hidden = hidden + attended
        gate, up = gate_up.split(shape.intermediate_size, dim=-1)
        return normed, norm2(hidden), F.silu(gate) * up

    def fused():        # DecoderLayer.forward_fused, the same parts
        # residual is updated in place, as in the layer: its values drift over the repeats, the work does not.
        normed = fused_ops.add_rms_norm(mlp_out, residual, norm1.weight, 1e-5)
        heads = qkv.view(num_tokens, -1, shape.head_dim)
        fused_ops.rotary_(heads[:, :shape.num_heads + shape.num_kv_heads], cos, sin)
        return normed, fused_ops.add_rms_norm(attended, residual, norm2.weight, 1e-5), fused_ops.silu_and_mul(gate_up)

    return pytorch, fused


def bench_layers(shapes: list[LayerShape], token_counts: list[int], dtype: torch.dtype, device: torch.device,
                 repeats: int) -> None:
    print(f"\n1. one layer's small ops, {dtype} on {device}: PyTorch ops (today's layer) vs fused Triton kernels")
    print(f"{'shape':>6} {'tokens':>7} {'launches':>14} {'PyTorch us':>11} {'fused us':>9} {'speedup':>8}")
    for shape in shapes:
        for num_tokens in token_counts:
            pytorch, fused = layer_ops(shape, num_tokens, dtype, device)
            launches = [count_kernels(function, device) for function in (pytorch, fused)]
            seconds = [time_per_call(function, device, repeats) for function in (pytorch, fused)]
            counts = "n/a on CPU" if launches[0] is None else f"{launches[0]} -> {launches[1]}"
            print(f"{shape.name:>6} {num_tokens:>7} {counts:>14} {seconds[0] * 1e6:>11.1f} {seconds[1] * 1e6:>9.1f} "
                  f"{seconds[0] / seconds[1]:>7.2f}x")


MIXED = [dict(temperature=0.0), dict(temperature=0.8, seed=7), dict(temperature=1.0, top_p=0.9),
         dict(temperature=0.7, top_k=50), dict(temperature=1.0, top_k=40, top_p=0.95, seed=3),
         dict(temperature=0.0, logprobs=5)]


def sampler_requests(batch_size: int) -> list[Request]:
    if batch_size == 1:     # alone: the common sampled request
        return [Request(0, [1, 2, 3], SamplingParams(temperature=0.8, top_p=0.95, seed=1))]
    return [Request(row, [1, 2, 3], SamplingParams(**MIXED[row % len(MIXED)])) for row in range(batch_size)]


def bench_sampler(vocab_size: int, batch_sizes: list[int], device: torch.device, repeats: int) -> None:
    print(f"\n2. the sampler per step, vocab {vocab_size:,} on {device}, mixed params "
          f"(greedy, seeded, temperature, top-k, top-p, logprobs): per-row peer vs vectorised")
    print(f"{'batch':>6} {'per-row ms':>11} {'vectorised ms':>14} {'speedup':>8}")
    for batch_size in batch_sizes:
        logits = torch.randn(batch_size, vocab_size, generator=torch.Generator().manual_seed(batch_size)).to(device)
        requests = sampler_requests(batch_size)
        seconds = [time_per_call(lambda s=sampler: s(logits, requests), device, repeats)
                   for sampler in (PerRowSampler(), Sampler(seed=0))]
        print(f"{batch_size:>6} {seconds[0] * 1e3:>11.2f} {seconds[1] * 1e3:>14.2f} {seconds[0] / seconds[1]:>7.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="tiny shapes on CPU (the kernels interpreted)")
    args = parser.parse_args()
    device = torch.device("cpu" if args.cpu or not torch.cuda.is_available() else "cuda")
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name()}")
        bench_layers(SHAPES, [1, 64, 256], torch.bfloat16, device, repeats=200)
        bench_sampler(128256, [1, 64, 256], device, repeats=20)
    else:
        print("device: CPU (tiny shapes; the fused kernels run in Triton's interpreter: their times mean nothing)")
        bench_layers(TINY, [1, 8], torch.float32, device, repeats=5)
        bench_sampler(32000, [1, 64], device, repeats=5)


if __name__ == "__main__":
    main()
