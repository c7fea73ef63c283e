"""Issue 21's generate checks on a GPU, one section of bench/gpu_check.py; each figure is
printed beside its peer from the same run (or, where there is none to run, the roofline
and the issue's target). Random weights of real shapes, built on the device: nothing is
read from disk but the random decoders' tokenizer text.

  1. the 1B Llama workload: 256 prompts of 32-512 tokens, outputs of 16-256 (seeded),
     Barge against transformers `generate` in padded batches of 64; generated tok/s, ratio.
  2. batch-1 decode tok/s on the 1B and 8B shapes as a share of the HBM roofline (the
     weight bytes a decode step reads over the GPU's bandwidth: H100 3.35, H200 4.8 TB/s).
  3. batch-64 decode tok/s on the 8B shape.
  4. greedy parity in fp32 against transformers on random Llama, Qwen2, Qwen3, Mistral
     (tests/support/random_decoders.py): identical tokens; bf16 agreement reported.
  5. the step split on the 1B shape: wall per step, host time per step (scheduling,
     metadata, bookkeeping) and the GPU-busy share (kernel time over wall, torch.profiler).

    python bench/gpu/generate.py          # on the GPU machine (bench/gpu_check.py runs it)
    python bench/gpu/generate.py --cpu    # here: tiny shapes and workload, to exercise the script

NOTE: the figures are for bf16 on the GPU (fp32 on CPU); nothing here is asserted but
parity (the exit status is 1 when fp32 tokens differ): speed is read, not tested.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(os.environ.get("BARGE_ROOT", Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

HBM_BYTES_PER_SECOND = {"H100": 3.35e12, "H200": 4.8e12}
SHAPE_1B = dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True,
                max_position_embeddings=4096, rope_theta=500000.0, bos_token_id=1, eos_token_id=2)
SHAPE_8B = dict(SHAPE_1B, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, tie_word_embeddings=False)
TINY = dict(SHAPE_1B, vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
TARGETS = "issue 21 targets on an H200: 8B batch-1 >= 65% of roofline; 1B batch-1 >= 1,200 tok/s; " \
          "workload >= 4x transformers; 8B batch-64 >= 6,000 tok/s"


@dataclass(frozen=True)
class Scale:
    num_prompts: int
    prompt_lens: tuple[int, int]
    output_lens: tuple[int, int]
    hf_batch: int
    decode_tokens: int          # batch-1 and batch-64 outputs
    batch_prompt_len: int
    wide_batch: int


GPU_SCALE = Scale(256, (32, 512), (16, 256), 64, 128, 128, 64)
CPU_SCALE = Scale(8, (8, 32), (4, 8), 4, 8, 8, 4)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="tiny shapes on CPU, to exercise the script")
    args = parser.parse_args()
    device = torch.device("cpu" if args.cpu or not torch.cuda.is_available() else "cuda")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    scale = CPU_SCALE if device.type == "cpu" else GPU_SCALE
    bandwidth, gpu_name = hbm_bandwidth(device)
    print(f"# issue 21 generate checks on {gpu_name}, {str(dtype).removeprefix('torch.')}; {TARGETS}", flush=True)
    if device.type == "cpu":
        print("# --cpu: a tiny Llama stands in for both the 1B and the 8B shape; the figures only show it runs")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        tokenizer = tokenizer_folder(Path(work))
        parity_ok = check_parity(Path(work), device)
        shape_1b, shape_8b = (TINY, TINY) if device.type == "cpu" else (SHAPE_1B, SHAPE_8B)
        check_workload_and_batch_1(shape_1b, tokenizer, scale, dtype, device, bandwidth)
        check_8b(shape_8b, tokenizer, scale, dtype, device, bandwidth)
    print(f"# done in {time.perf_counter() - started:.0f} s", flush=True)
    return 0 if parity_ok else 1


def hbm_bandwidth(device: torch.device) -> tuple[float | None, str]:
    if device.type != "cuda":
        return None, "CPU"
    name = torch.cuda.get_device_name(device)
    return next((value for key, value in HBM_BYTES_PER_SECOND.items() if key in name), None), name


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def tokenizer_folder(work: Path) -> Path:
    from tests.support.random_decoders import save_tokenizer
    folder = work / "tokenizer"
    folder.mkdir()
    save_tokenizer(folder)
    return folder


def hf_model(shape: dict, dtype: torch.dtype, device: torch.device):
    """A transformers Llama of `shape` with random weights, built on the device."""
    import transformers
    config = transformers.LlamaConfig(**{k: v for k, v in shape.items() if k != "model_type"})
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config).to(dtype)
    return model.eval()


def barge_engine(shape: dict, state: dict | None, tokenizer: Path, dtype: torch.dtype, device: torch.device,
                 **options):
    """Barge's LLMEngine over `state` (Hugging Face names, shared, not copied), or over
    random weights of `shape` built on the device when state is None."""
    from engine.generate import GenerateOptions, LLMEngine
    from engine.generate.model_config import decoder_config_from_hf
    from engine.generate.model_loader import build_model
    from engine.generate.tokenizer import TextTokenizer
    from engine.layers.packed_linear import pack_linears
    from engine.models.llama import LlamaForCausalLM

    config = decoder_config_from_hf(shape, shape["eos_token_id"])
    if state is None:
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                model = LlamaForCausalLM(config).eval()
        finally:
            torch.set_default_dtype(previous)
        model.tie_weights()
    else:
        model = build_model(config, state, dtype, device)
    options = GenerateOptions(**options)
    pack_linears(model, options.max_num_seqs)
    return LLMEngine(model, config, TextTokenizer.from_folder(tokenizer), options, dtype, device)


def decode_bytes(engine) -> int:
    """Bytes a decode step reads: every weight but the embedding table (one row of it is
    read), unless the LM head is that table."""
    model = engine.runner.model
    unique = {id(p): p for p in model.parameters()}
    embed = model.model.embed_tokens.weight
    total = sum(p.numel() * p.element_size() for p in unique.values())
    return total if model.lm_head.weight is embed else total - embed.numel() * embed.element_size()


def workload(scale: Scale, vocab_size: int) -> tuple[list[list[int]], list[int]]:
    generator = torch.Generator().manual_seed(0)
    lo, hi = scale.prompt_lens
    lengths = torch.randint(lo, hi + 1, (scale.num_prompts,), generator=generator).tolist()
    outputs = torch.randint(scale.output_lens[0], scale.output_lens[1] + 1, (scale.num_prompts,),
                            generator=generator).tolist()
    prompts = [torch.randint(3, vocab_size, (n,), generator=generator).tolist() for n in lengths]
    return prompts, outputs


def greedy(max_tokens: int):
    from engine.generate import SamplingParams
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def timed_generate(engine, prompts, params, device) -> float:
    sync(device)
    started = time.perf_counter()
    engine.generate(prompts, params)
    sync(device)
    return time.perf_counter() - started


@torch.inference_mode()
def hf_generate(model, prompts: list[list[int]], num_new: int, device: torch.device) -> torch.Tensor:
    """Left-padded greedy generate of exactly num_new tokens per prompt."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    return model.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=num_new,
                          min_new_tokens=num_new, do_sample=False, pad_token_id=0)


def check_workload_and_batch_1(shape, tokenizer, scale, dtype, device, bandwidth) -> None:
    hf = hf_model(shape, dtype, device)
    engine = barge_engine(shape, hf.state_dict(), tokenizer, dtype, device, max_num_seqs=256,
                          max_num_batched_tokens=8192)
    print(f"# 1B shape: settings {engine.settings}", flush=True)
    prompts, outputs = workload(scale, shape["vocab_size"])
    num_generated = sum(outputs)
    engine.generate(prompts[:4], greedy(4))      # warm-up: Triton compiles its kernels
    barge = timed_generate(engine, prompts, [greedy(n) for n in outputs], device)
    steps = engine.last_run.num_steps
    hf_generate(hf, prompts[:2], 4, device)
    sync(device)
    started = time.perf_counter()
    for start in range(0, len(prompts), scale.hf_batch):
        hf_generate(hf, prompts[start:start + scale.hf_batch], max(outputs[start:start + scale.hf_batch]), device)
    sync(device)
    peer = time.perf_counter() - started
    print(f"1. workload ({len(prompts)} prompts, {sum(map(len, prompts))} prompt / {num_generated} output tokens): "
          f"Barge {num_generated / barge:,.0f} tok/s ({steps} steps, {barge / steps * 1e3:.1f} ms/step) | "
          f"transformers padded batch {scale.hf_batch} {num_generated / peer:,.0f} tok/s | "
          f"ratio {peer / barge:.2f}x", flush=True)
    one = [prompts[0][:64]]
    barge_1 = timed_generate(engine, one, greedy(scale.decode_tokens), device)
    sync(device)
    started = time.perf_counter()
    hf_generate(hf, one, scale.decode_tokens, device)
    sync(device)
    peer_1 = time.perf_counter() - started
    print_roofline("2. batch-1 decode, 1B", engine, scale.decode_tokens / barge_1, bandwidth,
                   f"transformers {scale.decode_tokens / peer_1:,.0f} tok/s")
    check_step_split(engine, prompts, scale, device)
    del engine, hf
    if device.type == "cuda":
        torch.cuda.empty_cache()


def print_roofline(label: str, engine, tokens_per_second: float, bandwidth: float | None, peer: str) -> None:
    weight_bytes = decode_bytes(engine)
    if bandwidth is None:
        roof = "roofline n/a (no HBM figure for this device)"
    else:
        roofline = bandwidth / weight_bytes
        roof = (f"roofline {roofline:,.0f} tok/s ({weight_bytes / 1e9:.2f} GB at {bandwidth / 1e12:.2f} TB/s): "
                f"{100 * tokens_per_second / roofline:.1f}%")
    print(f"{label}: Barge {tokens_per_second:,.0f} tok/s | {roof} | {peer}", flush=True)


def check_step_split(engine, prompts, scale, device) -> None:
    """Host time: what the step spends in pure host work (schedule, metadata, bookkeeping),
    timed around those calls. GPU-busy: the kernels' device time over the steps' wall, from
    torch.profiler over the same steps (kernels replayed from CUDA graphs included)."""
    llm, runner = engine, engine.runner
    host = {"schedule": 0.0, "prepare": 0.0, "update": 0.0}
    originals = (llm.scheduler.schedule, runner.prepare, llm.scheduler.update_from_output)

    def timed(name, function):
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                host[name] += time.perf_counter() - started
        return wrapper

    llm.scheduler.schedule = timed("schedule", originals[0])
    runner.prepare = timed("prepare", originals[1])
    llm.scheduler.update_from_output = timed("update", originals[2])
    batch = [p[:32] for p in prompts[:scale.wide_batch]]
    llm.add_requests(batch, greedy(scale.decode_tokens // 2))
    llm.step()                                   # the prefill, not counted: decode steps are measured
    for name in host:
        host[name] = 0.0
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
    num_steps = 0
    with torch.profiler.profile(activities=activities) as profile:
        sync(device)
        started = time.perf_counter()
        while llm.scheduler.has_unfinished_requests():
            llm.step()
            num_steps += 1
        sync(device)
        wall = time.perf_counter() - started
    llm.scheduler.schedule, runner.prepare, llm.scheduler.update_from_output = originals
    busy = "n/a on CPU"
    if device.type == "cuda":
        kernel_us = sum(event.self_device_time_total for event in profile.key_averages()
                        if event.device_type == torch.autograd.DeviceType.CUDA)
        busy = f"{100 * kernel_us / 1e6 / wall:.0f}% ({kernel_us / 1e3 / num_steps:.2f} ms of kernels per step)"
    host_ms = sum(host.values()) * 1e3 / num_steps
    parts = ", ".join(f"{name} {seconds * 1e3 / num_steps:.2f}" for name, seconds in host.items())
    print(f"5. step split, {len(batch)} decoding sequences, {num_steps} decode steps (profiled): wall "
          f"{wall * 1e3 / num_steps:.2f} ms/step | host {host_ms:.2f} ms/step ({parts}) | GPU busy {busy}", flush=True)


def check_8b(shape, tokenizer, scale, dtype, device, bandwidth) -> None:
    engine = barge_engine(shape, None, tokenizer, dtype, device, max_num_seqs=scale.wide_batch,
                          max_num_batched_tokens=8192)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, shape["vocab_size"], (scale.batch_prompt_len,), generator=generator).tolist()
               for _ in range(scale.wide_batch)]
    engine.generate(prompts[:2], greedy(4))      # warm-up
    seconds = timed_generate(engine, prompts[:1], greedy(scale.decode_tokens), device)
    print_roofline("2. batch-1 decode, 8B", engine, scale.decode_tokens / seconds, bandwidth,
                   "first GPU run (f7a8048): 33 tok/s = 11%")
    seconds = timed_generate(engine, prompts, greedy(scale.decode_tokens), device)
    tokens = scale.wide_batch * scale.decode_tokens
    print(f"3. batch-{scale.wide_batch} on 8B ({scale.batch_prompt_len}-token prompts, {scale.decode_tokens} outputs "
          f"each, prefill included): Barge {tokens / seconds:,.0f} tok/s | first GPU run (f7a8048) 2,630 tok/s | "
          f"target 6,000", flush=True)
    del engine
    if device.type == "cuda":
        torch.cuda.empty_cache()


def check_parity(work: Path, device: torch.device) -> bool:
    """Greedy tokens of Barge and transformers on the random CPU-parity decoders, fp32 (must
    be identical) and bf16 (agreement reported: rounding may flip a near tie)."""
    import transformers

    from engine import Engine
    from tests.support.random_decoders import save_random_decoder

    generator = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 500, (n,), generator=generator).tolist() for n in (5, 17, 40, 64)]
    all_identical = True
    for family in ("llama", "qwen2", "qwen3", "mistral"):
        folder = save_random_decoder(work / family, family)
        counts = {}
        for dtype in (torch.float32, torch.bfloat16) if device.type == "cuda" else (torch.float32,):
            engine = Engine.from_pretrained(folder, mode="generate", dtype=dtype, device=device, num_blocks=256)
            ours = [out.token_ids for out in engine.generate(prompts, greedy(16))]
            reference = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
            # no EOS on their side either: min_new_tokens would mask it, changing the argmax where it wins
            reference.generation_config.eos_token_id = None
            with torch.inference_mode():
                theirs = [reference.generate(torch.tensor([p], device=device), max_new_tokens=16, do_sample=False,
                                             pad_token_id=0)[0, len(p):].tolist() for p in prompts]
            counts[dtype] = sum(a == b for a, b in zip(ours, theirs))
            del engine, reference
        all_identical &= counts[torch.float32] == len(prompts)
        bf16 = f", bf16 {counts[torch.bfloat16]}/{len(prompts)}" if torch.bfloat16 in counts else ""
        print(f"4. greedy parity, {family}: fp32 {counts[torch.float32]}/{len(prompts)} identical to transformers"
              f"{bf16}", flush=True)
    return all_identical


if __name__ == "__main__":
    sys.exit(main())
