"""FP8 against bf16: decode tokens/s on a random Llama, and every Triton kernel's max error
against its PyTorch reference (the FP8 GEMMs, the embed path's varlen attention).

On a GPU: an 8B-shaped Llama (hidden 4096, 32 layers, FFN 14336, GQA 32/8, vocab 128256),
batches 1 and 64, bf16 beside `fp8` (per-channel) and `fp8-block` (128x128) in one run, each
model built once and run at both batches. The FP8 models run whatever the GPU supports (W8A8
on capability >= 8.9: activations quantized by engine/kernels/fp8_act_quant.py, then
_scaled_mm or the Triton group GEMM; the Triton weight-only kernel below it), with Barge's
default recipe (engine/quant/config.py: what stays 16-bit, how scales are chosen).
On CPU it runs a tiny shape (kernels under TRITON_INTERPRET=1), so the script is exercised
everywhere; CPU speeds say nothing about GPUs. On a GPU the varlen attention kernel is also
timed on texts of mixed lengths beside SDPA per equal-length run (its fallback) and SDPA over
the padded batch (what padding costs).

The FP8 KV cache (kv_cache_dtype="fp8", engine/generate/kv_cache.py) is compared on the
bf16 model, built once: the blocks that fit beside its weights in the same memory with
either cache, and decode tokens/s at the larger batch with the fp8 cache beside the bf16
cache's figure from the same run (the weights' comparison above).

    python bench/fp8_bench.py                      # GPU: the 8B shape; CPU: tiny
    python bench/fp8_bench.py --schemes fp8 --max-tokens 256
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")     # before triton's first import
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # the repo root, for tests.support

from engine.generate import GenerateOptions, LLMEngine, SamplingParams  # noqa: E402
from engine.generate.kv_cache import FP8_KV_DTYPE, available_memory, bytes_per_block  # noqa: E402
from engine.generate.model_config import DecoderConfig  # noqa: E402
from engine.generate.model_loader import build_model  # noqa: E402
from engine.generate.tokenizer import TextTokenizer  # noqa: E402
from engine.embed.batching import attention_groups, cu_seqlens  # noqa: E402
from engine.layers.attention import SlidingWindow, attend_per_group  # noqa: E402
from engine.layers.fp8_linear import Fp8Linear, fp8_backend, fp8_linear, fp8_weight_bytes  # noqa: E402
from engine.quant.checkpoint import load_fp8_state  # noqa: E402
from engine.quant.config import fp8_config_from_name  # noqa: E402
from engine.quant.recipe import describe_recipe  # noqa: E402
from engine.quant.fp8 import block_scales_to_rows, quantize_activations, quantize_blocks, quantize_per_channel  # noqa: E402
from tests.support.random_decoders import save_tokenizer  # noqa: E402

LLAMA_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                num_kv_heads=8, head_dim=128)
TINY = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4,
            num_kv_heads=2, head_dim=64)


def decoder_config(shape: dict) -> DecoderConfig:
    return DecoderConfig(model_type="llama", rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=4096,
                         tie_word_embeddings=False, qkv_bias=False, qk_norm=False, **shape)


def random_state(config: DecoderConfig, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Hugging Face names, N(0, 0.02) weights: built on the device, no checkpoint on disk."""
    generator = torch.Generator(device=device).manual_seed(0)
    h, f, q, kv = config.hidden_size, config.intermediate_size, config.num_heads * config.head_dim, \
        config.num_kv_heads * config.head_dim
    shapes = {"model.embed_tokens.weight": (config.vocab_size, h), "lm_head.weight": (config.vocab_size, h)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                       p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                       p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                       p + "mlp.down_proj.weight": (h, f)})
    state = {name: (torch.randn(shape, generator=generator, device=device) * 0.02).to(dtype)
             for name, shape in shapes.items()}
    for i in range(config.num_layers):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            state[f"model.layers.{i}.{norm}.weight"] = torch.ones(config.hidden_size, device=device, dtype=dtype)
    state["model.norm.weight"] = torch.ones(config.hidden_size, device=device, dtype=dtype)
    return state


def decode_speeds(config, quantization, tokenizer, device, dtype, batches, max_tokens,
                  fp8_kv_batch: int | None = None) -> tuple[list[float], float, list[str]]:
    """(tokens/s at each batch, the FP8 layers' stored bytes over bf16's, and with
    fp8_kv_batch the KV-cache lines: capacity, and tokens/s at that batch with an fp8 cache)
    for one model, built once."""
    state, fp8 = load_fp8_state(random_state(config, device, dtype), None, quantization)
    model = build_model(config, state, dtype, device, fp8)
    del state
    stored, bf16 = fp8_weight_bytes(model)
    speeds = [decode_tokens_per_second(model, config, tokenizer, device, dtype, batch, max_tokens) for batch in batches]
    kv_lines = []
    if fp8_kv_batch is not None:
        kv_lines.append(kv_capacity_line(config, device))
        fp8_kv = decode_tokens_per_second(model, config, tokenizer, device, dtype, fp8_kv_batch, max_tokens, "fp8")
        peer = speeds[batches.index(fp8_kv_batch)]
        kv_lines.append(f"batch {fp8_kv_batch:3}: bf16 KV cache {peer:9.1f} tok/s   fp8 KV cache {fp8_kv:9.1f} tok/s   "
                        f"ratio {fp8_kv / peer:.2f}x   (bf16 weights, 32-token prompts)")
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return speeds, (stored / bf16 if bf16 else 1.0), kv_lines


def kv_capacity_line(config: DecoderConfig, device: torch.device, block_size: int = 16) -> str:
    """Blocks of either cache in 90 % of the memory free beside the loaded model."""
    budget = int(available_memory(device) * 0.9)
    bf16, fp8 = (budget // bytes_per_block(config, block_size, dtype) for dtype in (torch.bfloat16, FP8_KV_DTYPE))
    return (f"KV cache in {budget / 2**30:.1f} GiB: bf16 {bf16} blocks, fp8 {fp8} blocks of {block_size} tokens "
            f"(ratio {fp8 / bf16:.2f}x; {fp8 * block_size // 4096} against {bf16 * block_size // 4096} "
            f"sequences of 4,096 tokens)")


def decode_tokens_per_second(model, config, tokenizer, device, dtype, batch, max_tokens,
                             kv_cache_dtype: str = "auto") -> float:
    engine = LLMEngine(model, config, tokenizer, GenerateOptions(max_num_seqs=batch, num_blocks=batch * 24 + 8,
                                                                 block_size=16, max_num_batched_tokens=4096,
                                                                 kv_cache_dtype=kv_cache_dtype),
                       dtype, device)
    prompts = [[(7 * row + 3 * i) % 500 + 3 for i in range(32)] for row in range(batch)]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    engine.generate(prompts, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))    # warm-up
    _sync(device)
    started = time.perf_counter()
    engine.generate(prompts, params)
    _sync(device)
    tokens_per_second = batch * max_tokens / (time.perf_counter() - started)
    del engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return tokens_per_second


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def kernel_errors(device: torch.device, shapes: list[tuple[int, int, int]]) -> list[str]:
    """Max |kernel - reference| (and the reference's max |value|) for every FP8 Triton kernel."""
    from engine.kernels import fp8_matmul
    lines = []
    for tokens, out_features, in_features in shapes:
        weight = torch.randn(out_features, in_features, device=device) * 0.02
        q_channel, channel_scale = quantize_per_channel(weight)
        q_block, block_scale = quantize_blocks(weight)
        block_rows = block_scales_to_rows(block_scale, out_features, 128)
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            x = torch.randn(tokens, in_features, device=device).to(dtype)
            for name, q, scale, group in (("per-channel", q_channel, channel_scale, in_features),
                                          ("block", q_block, block_rows, 128)):
                ours = fp8_matmul.fp8_weight_only_matmul(x, q, scale, group)
                expected = fp8_matmul.reference_weight_only(x, q, scale, group)
                lines.append(_error_line(f"weight-only {name} {str(dtype)[6:]}", (tokens, out_features, in_features),
                                         ours, expected))
        x_q, x_scale = quantize_activations(torch.randn(tokens, in_features, device=device), 128)
        ours = fp8_matmul.fp8_w8a8_group_matmul(x_q, x_scale, q_block, block_rows, 128, torch.bfloat16)
        expected = fp8_matmul.reference_w8a8(x_q, x_scale, q_block, block_rows, 128, torch.bfloat16)
        lines.append(_error_line("w8a8 block bf16", (tokens, out_features, in_features), ours, expected))
        lines.append(_act_quant_line(device, tokens, in_features))
        if fp8_backend(device) == "w8a8":     # not Triton, but the other W8A8 path: torch._scaled_mm
            lines.append(_scaled_mm_error(device, tokens, q_channel, channel_scale))
    return lines


def _act_quant_line(device: torch.device, tokens: int, in_features: int) -> str:
    """The activation-quantization kernels against quantize_activations: E4M3 bytes that differ."""
    from engine.kernels import fp8_act_quant
    x = torch.randn(tokens, in_features, device=device, dtype=torch.bfloat16)
    counts = []
    for (q, scale), (q_ref, scale_ref) in ((fp8_act_quant.quantize_per_token(x), quantize_activations(x)),
                                           (fp8_act_quant.quantize_per_group(x, 128), quantize_activations(x, 128))):
        counts.append(f"{int((q.view(torch.uint8) != q_ref.view(torch.uint8)).sum())} bytes, "
                      f"{int((scale != scale_ref).sum())} scales differ")
    return f"  {'act quant token / group':28} M,K=({tokens}, {in_features}): " + "; ".join(counts)


def _scaled_mm_error(device: torch.device, tokens: int, q: torch.Tensor, scale: torch.Tensor) -> str:
    from engine.kernels import fp8_matmul
    out_features, in_features = q.shape
    layer = Fp8Linear(in_features, out_features, False, 1, in_features).to(device)
    layer.weight, layer.weight_scale = q, scale
    x = torch.randn(tokens, in_features, device=device, dtype=torch.bfloat16)
    x_q, x_scale = quantize_activations(x)
    expected = fp8_matmul.reference_w8a8(x_q, x_scale, q, scale, in_features, torch.bfloat16)
    return _error_line("_scaled_mm per-channel bf16", (tokens, out_features, in_features), fp8_linear(x, layer), expected)


def _error_line(name: str, shape: tuple, ours: torch.Tensor, expected: torch.Tensor) -> str:
    error = (ours.float() - expected.float()).abs().max().item()
    return f"  {name:28} M,N,K={shape}: max error {error:.3g} (max |ref| {expected.float().abs().max().item():.3g})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schemes", nargs="+", default=["fp8", "fp8-block"], choices=["fp8", "fp8-block", "fp8-group"])
    parser.add_argument("--max-tokens", type=int, default=None, help="tokens generated per request")
    args = parser.parse_args()
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    config = decoder_config(LLAMA_8B if on_gpu else TINY)
    batches = (1, 64) if on_gpu else (1, 8)
    max_tokens = args.max_tokens or (128 if on_gpu else 8)
    with tempfile.TemporaryDirectory() as folder:
        save_tokenizer(Path(folder))
        tokenizer = TextTokenizer.from_folder(folder)
    print(f"device {torch.cuda.get_device_name() if on_gpu else 'cpu'}, FP8 backend {fp8_backend(device)!r}, "
          f"{config.num_layers} layers x hidden {config.hidden_size}, {max_tokens} tokens per request")
    print(f"recipe: {describe_recipe(fp8_config_from_name(args.schemes[0]))}")
    bf16, _, kv_lines = decode_speeds(config, None, tokenizer, device, torch.bfloat16, batches, max_tokens,
                                      fp8_kv_batch=batches[-1])
    for scheme in args.schemes:
        speeds, ratio, _ = decode_speeds(config, scheme, tokenizer, device, torch.bfloat16, batches, max_tokens)
        for batch, fp8, peer in zip(batches, speeds, bf16):
            print(f"batch {batch:3}: bf16 {peer:9.1f} tok/s   {scheme:9} {fp8:9.1f} tok/s   "
                  f"ratio {fp8 / peer:.2f}x   FP8 layer weights {ratio:.1%} of bf16")
    print("\n".join(kv_lines))
    shapes = [(1, 4096, 4096), (64, 14336, 4096), (64, 4096, 14336)] if on_gpu else [(3, 96, 256), (17, 130, 200)]
    print("Triton kernels against their PyTorch references" + ("" if on_gpu else " (TRITON_INTERPRET=1)"))
    print("\n".join(kernel_errors(device, shapes)))
    print("\n".join(varlen_attention_errors(device, on_gpu)))
    if on_gpu:
        print("varlen attention, 256 texts of 16-512 tokens (bf16; GPU only: the interpreter says nothing of speed)")
        print("\n".join(varlen_attention_speeds(device)))


# (name, num_heads, num_kv_heads, head_dim, causal, half_window): BERT, LLM embedder, ModernBERT local
VARLEN_CASES = [("bidirectional", 12, 12, 64, False, None), ("causal GQA", 16, 8, 128, True, None),
                ("window 64", 12, 12, 64, False, 64)]
TINY_VARLEN_CASES = [("bidirectional", 2, 2, 16, False, None), ("causal GQA", 4, 2, 32, True, None),
                     ("window 4", 2, 2, 16, False, 4)]


def _packed_qkv(seq_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int, device, dtype):
    num_tokens = sum(seq_lens)
    return tuple(torch.randn(num_tokens, heads, head_dim, device=device, dtype=dtype)
                 for heads in (num_heads, num_kv_heads, num_kv_heads))


def varlen_attention_errors(device: torch.device, on_gpu: bool) -> list[str]:
    """Max |kernel - reference| of the varlen attention kernel, fp32 / bf16 / fp16."""
    from engine.kernels import varlen_attention
    seq_lens = [1, 7, 64, 129, 300, 512] if on_gpu else [1, 5, 17, 33]
    cu = cu_seqlens(attention_groups(seq_lens)).to(device)
    lines = []
    for name, num_heads, num_kv_heads, head_dim, causal, half_window in (VARLEN_CASES if on_gpu else TINY_VARLEN_CASES):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            q, k, v = _packed_qkv(seq_lens, num_heads, num_kv_heads, head_dim, device, dtype)
            ours = varlen_attention.varlen_attention(q, k, v, cu, max(seq_lens), causal, half_window)
            expected = varlen_attention.reference_varlen_attention(q, k, v, cu, causal, half_window)
            lines.append(_error_line(f"varlen attn {name} {str(dtype)[6:]}", (sum(seq_lens), num_heads, head_dim),
                                     ours, expected).replace("M,N,K=", "T,H,D="))
    return lines


def varlen_attention_speeds(device: torch.device) -> list[str]:
    """Tokens/s of the kernel, SDPA per equal-length run, and SDPA over the padded batch."""
    from engine.kernels import varlen_attention
    generator = torch.Generator().manual_seed(0)
    seq_lens = sorted(torch.randint(16, 513, (256,), generator=generator).tolist())    # sorted as plan_batches does
    groups = attention_groups(seq_lens)
    cu, max_len, num_tokens = cu_seqlens(groups).to(device), max(seq_lens), sum(seq_lens)
    lines = []
    for name, num_heads, num_kv_heads, head_dim, causal, half_window in VARLEN_CASES:
        q, k, v = _packed_qkv(seq_lens, num_heads, num_kv_heads, head_dim, device, torch.bfloat16)
        window = SlidingWindow(half_window, None) if half_window is not None else None
        # kv heads repeated for the padded peer: SDPA's GQA flag with a mask would leave it only the math kernel
        group_size = num_heads // num_kv_heads
        padded_q, padded_k, padded_v, mask = _padded(q, k.repeat_interleave(group_size, 1),
                                                     v.repeat_interleave(group_size, 1), seq_lens, causal, half_window)
        kernel = _seconds(lambda: varlen_attention.varlen_attention(q, k, v, cu, max_len, causal, half_window))
        per_group = _seconds(lambda: attend_per_group(q, k, v, groups, window, causal))
        padded = _seconds(lambda: torch.nn.functional.scaled_dot_product_attention(
            padded_q, padded_k, padded_v, attn_mask=mask))
        lines.append(f"  {name:14} H={num_heads}/{num_kv_heads} D={head_dim}: kernel {num_tokens / kernel:12,.0f} tok/s"
                     f"   SDPA per run {num_tokens / per_group:12,.0f} ({per_group / kernel:.2f}x slower)"
                     f"   SDPA padded {num_tokens / padded:12,.0f} ({padded / kernel:.2f}x slower)")
    return lines


def _padded(q, k, v, seq_lens, causal, half_window):
    """[num_seqs, heads, max_len, head_dim] copies and the bool mask a padding engine would use."""
    lens = torch.tensor(seq_lens, device=q.device)
    positions = torch.arange(max(seq_lens), device=q.device)
    is_real = positions[None, :] < lens[:, None]                                   # [num_seqs, max_len]
    tensors = []
    for x in (q, k, v):
        padded = x.new_zeros(len(seq_lens), max(seq_lens), *x.shape[1:])
        padded[is_real] = x
        tensors.append(padded.transpose(1, 2))
    mask = is_real[:, None, None, :].expand(-1, 1, max(seq_lens), -1)
    if causal:
        mask = mask & (positions[:, None] >= positions[None, :])
    if half_window is not None:
        mask = mask & ((positions[:, None] - positions[None, :]).abs() <= half_window)
    return (*tensors, mask)


def _seconds(run, repeats: int = 10) -> float:
    run(), run()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        run()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / repeats


if __name__ == "__main__":
    main()
