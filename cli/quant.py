"""`barge quantize` and `barge eval-quant`: argument parsing only; the work is in engine/quant/."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SCHEMES = ["fp8", "fp8-block", "fp8-group"]


def add_commands(commands: argparse._SubParsersAction) -> None:
    quantize = commands.add_parser("quantize", help="write an FP8 copy of a model folder (workers load half the bytes)")
    quantize.add_argument("source", help="Hugging Face model folder (config.json + safetensors)")
    quantize.add_argument("destination", help="new folder for the FP8 checkpoint")
    quantize.add_argument("--scheme", default="fp8", choices=SCHEMES,
                          help="fp8: per-channel scales (compressed-tensors); fp8-block: 128x128 (HF fp8); "
                               "fp8-group: 1x128 (HF fp8)")
    quantize.set_defaults(func=_quantize)
    evaluate = commands.add_parser("eval-quant", help="compare a model in FP8 with its 16/32-bit self")
    evaluate.add_argument("model", help="model folder or .gguf file")
    evaluate.add_argument("--scheme", default="fp8", choices=SCHEMES)
    evaluate.add_argument("--mode", choices=["embed", "generate"], help="default: from the model's config")
    evaluate.add_argument("--dtype", default="float32", help="baseline and compute dtype")
    evaluate.add_argument("--samples", type=int, default=500, help="sentences of /usr/share/common-licenses")
    evaluate.add_argument("--num-tokens", type=int, default=1024, help="tokens scored for perplexity")
    evaluate.add_argument("--perplexity-text", metavar="PATH", action="append",
                          help="score this file; repeat for several (default: held-out licences and docs "
                               "on this machine, engine.quant.evaluate.HELD_OUT_TEXTS)")
    evaluate.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"],
                          help="fp8: also score perplexity with an E4M3 KV cache, under both weights (generate)")
    evaluate.set_defaults(func=_eval_quant)


def _quantize(args) -> int:
    from engine.quant.writer import quantize_checkpoint
    try:
        report = quantize_checkpoint(args.source, args.destination, args.scheme)
    except (ValueError, FileNotFoundError) as exc:
        print(f"barge: {exc}", file=sys.stderr)
        return 2
    print(f"{report.num_quantized} linear weights in FP8 ({args.scheme}); tensor bytes "
          f"{report.bytes_before / 2**20:.1f} MiB -> {report.bytes_after / 2**20:.1f} MiB; wrote {args.destination}")
    return 0


def _eval_quant(args) -> int:
    from engine.quant.evaluate import evaluate
    try:
        texts = {Path(path).name: Path(path).read_text(encoding="utf-8") for path in args.perplexity_text or ()}
        result = evaluate(args.model, args.scheme, mode=args.mode, dtype=args.dtype, num_samples=args.samples,
                          num_tokens=args.num_tokens, perplexity_texts=texts or None,
                          kv_cache_dtype=args.kv_cache_dtype)
    except (ValueError, OSError) as exc:
        print(f"barge: {exc}", file=sys.stderr)
        return 2
    print(result.format())
    return 0
