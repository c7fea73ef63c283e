"""The FP8 KV cache (GenerateOptions.kv_cache_dtype="fp8", engine/generate/kv_cache.py):
what the store writes against the format's own bounds, how many blocks fit, and a random
Llama's greedy tokens and prompt logprobs against the same engine with its fp32 cache,
on the native path and (under Triton's interpreter) the paged kernel's, prefix hits included."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine.generate.kv_cache import (FP8_KV_DTYPE, FP8_MAX, MIN_SCALE, allocate_kv_cache,  # noqa: E402
                                      bytes_per_block, dequantize_rows, store_kv)
from engine.generate.model_config import DecoderConfig  # noqa: E402
from engine.generate.options import GenerateOptions  # noqa: E402
from engine.gpu_memory import GIB, plan_kv_cache  # noqa: E402
from engine.token_ids import common_prefix  # noqa: E402
from tests.support.sm90 import assert_compiles_without_interpreter  # noqa: E402

E4M3_HALF_ULP = 2.0 ** -4           # 3 mantissa bits: round to nearest is within 2^-4 of a normal value
E4M3_SUBNORMAL_HALF_STEP = 2.0 ** -10   # subnormals are multiples of 2^-9


def decoder_config(num_layers=2, num_kv_heads=2, head_dim=16, num_heads=4):
    return DecoderConfig("llama", 512, num_heads * head_dim, 128, num_layers, num_heads, num_kv_heads, head_dim,
                         1e-5, 1e4, 512, False, False, False)


def test_the_store_writes_each_row_with_its_own_absmax_scale():
    """Given rows of very different magnitudes (one all zero), when they are stored in an fp8
    cache: each slot's scale is its row's absolute maximum / 448, its largest value lands on
    448, every value is within E4M3's rounding of the original, and other slots keep their zeros."""
    config = decoder_config()
    (cache,) = allocate_kv_cache(decoder_config(num_layers=1), num_blocks=4, block_size=4, dtype=FP8_KV_DTYPE,
                                 device=torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    magnitudes = torch.tensor([1e-3, 1.0, 30.0, 0.0, 500.0])[:, None, None]
    k = torch.randn(5, config.num_kv_heads, config.head_dim, generator=generator) * magnitudes
    v = torch.randn(5, config.num_kv_heads, config.head_dim, generator=generator) * magnitudes
    slots = torch.tensor([3, 4, 9, 10, 15])
    store_kv(cache, k, v, slots)
    for rows, values, scales in ((k, cache.k, cache.k_scale), (v, cache.v, cache.v_scale)):
        flat_values, flat_scales = values.view(2, -1, config.head_dim), scales.view(2, -1)
        stored = flat_values[:, slots].transpose(0, 1)          # [tokens, kv_heads, head_dim]
        stored_scales = flat_scales[:, slots].transpose(0, 1)   # [tokens, kv_heads]
        amax = rows.abs().amax(dim=-1)
        expected_scales = torch.where(amax > 0, amax / FP8_MAX, torch.full_like(amax, MIN_SCALE))
        torch.testing.assert_close(stored_scales, expected_scales, rtol=1e-7, atol=0)
        assert values.dtype == FP8_KV_DTYPE and scales.dtype == torch.float32
        assert torch.equal(stored.float().abs().amax(dim=-1)[amax > 0], torch.full_like(amax[amax > 0], FP8_MAX))
        error = (dequantize_rows(stored, stored_scales, torch.float32) - rows).abs()
        bound = torch.maximum(E4M3_HALF_ULP * rows.abs(), E4M3_SUBNORMAL_HALF_STEP * stored_scales[..., None])
        assert (error <= bound * (1 + 1e-6)).all()
        assert torch.equal(stored[3].float(), torch.zeros_like(stored[3].float()))     # the zero row
        untouched = torch.ones(flat_scales.shape[1], dtype=torch.bool)
        untouched[slots] = False
        assert not flat_values[:, untouched].float().any() and (flat_scales[:, untouched] == MIN_SCALE).all()


@pytest.mark.parametrize("head_dim, at_least", [(128, 1.93), (64, 1.88)])
def test_fp8_blocks_fit_about_twice_as_many_as_bf16_in_the_same_memory(head_dim, at_least):
    """The 8B shape (32 layers, 8 kv heads, head_dim 128) and SmolLM2's head_dim 64: one
    fp32 scale per 128 or 64 E4M3 values costs 3 or 6 % of the halving."""
    config = decoder_config(num_layers=32, num_kv_heads=8, head_dim=head_dim, num_heads=32)
    bf16, fp8 = (bytes_per_block(config, 16, dtype) for dtype in (torch.bfloat16, FP8_KV_DTYPE))
    assert bf16 == 2 * 32 * 16 * 8 * head_dim * 2 and fp8 == 2 * 32 * 16 * 8 * (head_dim + 4)
    plans = [plan_kv_cache(80 * GIB, 0.9, 16 * GIB, 2 * GIB, size, 16, 2048) for size in (bf16, fp8)]
    assert plans[1].num_blocks / plans[0].num_blocks >= max(at_least, 1.8)


def test_an_engine_sized_from_memory_takes_the_fp8_block_size(monkeypatch):
    """kv_cache_blocks (what LLMEngine sizes its cache by, num_blocks not given) counts an
    fp8 block's bytes: the same free memory holds 1.88x the blocks of a bf16 model's cache."""
    import engine.generate.kv_cache as kv_cache
    from engine.gpu_memory import kv_cache_blocks
    monkeypatch.setattr(kv_cache, "available_memory", lambda device: 64 * GIB)
    config = decoder_config(num_layers=30, num_kv_heads=3, head_dim=64, num_heads=9)     # SmolLM2's cache shape
    counts = [kv_cache_blocks(None, config, GenerateOptions(max_num_seqs=4096, kv_cache_dtype=kv), torch.bfloat16,
                              torch.device("cpu"), max_model_len=8192) for kv in ("auto", "fp8")]
    assert counts[1] / counts[0] >= 1.88 - 1e-3


def test_an_unknown_kv_cache_dtype_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="kv_cache_dtype.*'int8'"):
        GenerateOptions(kv_cache_dtype="int8")
    assert GenerateOptions().kv_cache_dtype == "auto"


# --- through the engine: a random Llama ---------------------------------------------------

BLOCK_SIZE = 4
OPTIONS = dict(num_blocks=96, block_size=BLOCK_SIZE, max_num_batched_tokens=24, max_num_seqs=8)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.support.random_decoders import save_random_decoder
    return save_random_decoder(tmp_path_factory.mktemp("llama"), "llama")


def load(path, monkeypatch, backend="native", **options):
    """The native path on CPU; the Triton path on the GPU where there is one (the compiled
    kernel takes no CPU tensor), else on CPU under the interpreter."""
    from engine import Engine
    monkeypatch.setenv("BARGE_ATTENTION_BACKEND", backend)
    device = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
    return Engine.from_pretrained(path, mode="generate", device=device, dtype="float32", **{**OPTIONS, **options})


def prompts():
    generator = torch.Generator().manual_seed(4)
    return [torch.randint(3, 500, (length,), generator=generator).tolist() for length in (33, 1, 9, 50, 17)]


def generate(engine, max_tokens=12):
    from engine import SamplingParams
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=0, prompt_logprobs=0)
    return engine.generate(prompts(), params)


def test_the_settings_report_the_cache_dtype_and_its_blocks(llama, monkeypatch):
    engine = load(llama, monkeypatch, kv_cache_dtype="fp8")
    assert engine.settings["kv_cache_dtype"] == "float8_e4m3fn" and engine.settings["num_kv_blocks"] == 96
    assert load(llama, monkeypatch).settings["kv_cache_dtype"] == "float32"
    layer = engine.llm.runner.kv_cache[0]
    assert layer.k.dtype == FP8_KV_DTYPE and layer.k_scale.shape == layer.k.shape[:-1]
    assert not engine.llm.runner.use_cpu_kernel     # the compiled decode kernel reads fp32 caches only
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        load(llama, monkeypatch, kv_cache_dtype="fp16")


def test_fp8_cache_greedy_tokens_and_logprobs_stay_close_to_the_fp32_cache(llama, monkeypatch):
    """Chunked prefill (24 tokens a step), so later chunks and every decode read E4M3 K/V.

    NOTE: this random model is a harsh case: its wide init (tests/support/random_decoders.py)
    makes attention scores of std ~4 with no outlier channels, so E4M3's ~2 % rms per value
    moves scores by tenths. Seen: 39 of 60 greedy tokens before each prompt's first
    divergence, every first token equal, prompt logprobs within 0.76 (mean 0.12). SmolLM2's
    perplexity through an fp8 cache is the quality measure (barge eval-quant --kv-cache-dtype fp8)."""
    reference = generate(load(llama, monkeypatch))
    ours = generate(load(llama, monkeypatch, kv_cache_dtype="fp8"))
    agreed = sum(common_prefix(a.token_ids, b.token_ids) for a, b in zip(reference, ours))
    assert agreed / sum(len(a.token_ids) for a in reference) >= 0.5
    assert [a.token_ids[0] for a in reference] == [b.token_ids[0] for b in ours]
    differences = [abs(next(iter(a.values())) - next(iter(b.values())))
                   for x, y in zip(reference, ours) for a, b in zip(x.prompt_logprobs[1:], y.prompt_logprobs[1:])]
    assert max(differences) <= 1.0 and sum(differences) / len(differences) <= 0.15


def test_the_paged_kernel_reads_the_fp8_cache_as_the_native_path_does(llama, monkeypatch):
    """Under Triton's interpreter: the same greedy tokens from both paths over an fp8 cache,
    through chunked prefill and a prefix-cache hit (the second round's 32 cached tokens
    are read back from E4M3)."""
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and TRITON_INTERPRET is not 1")
    from engine import SamplingParams
    generator = torch.Generator().manual_seed(4)
    shared = torch.randint(3, 500, (33,), generator=generator).tolist()
    rounds = ([shared, [7], torch.randint(3, 500, (9,), generator=generator).tolist()],
              [shared[:32] + [11, 12, 13, 14, 15], [9, 8]])
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    results = []
    for backend in ("native", "triton"):
        engine = load(llama, monkeypatch, backend, kv_cache_dtype="fp8")
        outputs = [engine.generate(prompts_of_round, params) for prompts_of_round in rounds]
        results.append(([out.token_ids for round_ in outputs for out in round_], outputs[1][0].num_cached_tokens))
    assert results[0][1] == results[1][1] == 32
    assert results[0][0] == results[1][0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_triton_store_writes_the_bytes_the_tensor_ops_write(dtype):
    """The one-launch store CUDA uses (engine/kernels/kv_store.py) against the tensor-op
    store: the same E4M3 values (bytes equal but for the sign of a zero: the zero row's -0.0
    inputs stay -0 through torch's cast, the kernel's rounding in fp32 makes them +0), and
    the same scales. Magnitudes from 1e-3 to 500, a zero row, values on E4M3 rounding
    ties, k and v as views into one QKV output (strided rows, as the model passes them)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and TRITON_INTERPRET is not 1")
    from engine.kernels.kv_store import store_fp8_kv
    config = decoder_config(num_layers=1, num_kv_heads=2, head_dim=24)
    generator = torch.Generator().manual_seed(1)
    qkv = torch.randn(6, 4 + 2 + 2, 24, generator=generator) * torch.tensor([1e-3, 1.0, 30.0, 0.0, 500.0, 7.0])[:, None,
                                                                                                              None]
    qkv[5, 4, :8] = torch.tensor([448.0, 1.0625, 3.25, -0.6875, 13.0, 1.125, 9.0, -17.0])   # ties at scale 1
    qkv = qkv.to(device, dtype)
    k, v = qkv[:, 4:6], qkv[:, 6:8]
    slots = torch.tensor([3, 4, 9, 10, 15, 0], device=device)
    # the tensor-op store on CPU (store_kv takes the kernel on CUDA), the kernel on the device
    reference = allocate_kv_cache(config, 4, 4, FP8_KV_DTYPE, torch.device("cpu"))[0]
    store_kv(reference, k.cpu(), v.cpu(), slots.cpu())
    cache = allocate_kv_cache(config, 4, 4, FP8_KV_DTYPE, torch.device(device))[0]
    store_fp8_kv(k, v, slots, cache.k, cache.v, cache.k_scale, cache.v_scale)
    for ops, kernel in zip(reference, cache):
        assert torch.equal(ops.float(), kernel.cpu().float())     # each E4M3 value is one float, -0.0 == 0.0


def test_decode_steps_through_the_graph_buffers_read_the_fp8_cache_alike(llama, monkeypatch):
    """The decode-graph runner with capture off (engine/generate/cuda_graph.py): its static
    buffers and padding rows (their K/V quantized into the dummy block) give the tokens of
    eager steps over the same fp8 cache."""
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and TRITON_INTERPRET is not 1")
    from engine import SamplingParams
    from engine.generate.cuda_graph import CudaGraphRunner
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    eager = load(llama, monkeypatch, "triton", kv_cache_dtype="fp8", enforce_eager=True)
    expected = [out.token_ids for out in eager.generate(prompts()[:3], params)]
    engine = load(llama, monkeypatch, "triton", kv_cache_dtype="fp8", enforce_eager=True)
    llm = engine.llm
    llm.runner.graphs = CudaGraphRunner(llm.runner.model, llm.runner.kv_cache, OPTIONS["max_num_seqs"],
                                        llm.max_model_len // BLOCK_SIZE, llm.block_manager.num_blocks * BLOCK_SIZE,
                                        llm.runner.device, capture=False)
    assert [out.token_ids for out in engine.generate(prompts()[:3], params)] == expected
    assert llm.runner.graphs.num_runs > 0


def test_fp8_is_refused_where_the_kernel_cannot_widen_it(monkeypatch):
    """Triton widens E4M3 on compute capability 8.9 and later: an A100 (8.0) is refused at
    construction, naming the option and the GPU; an H100 (9.0) and the CPU are not."""
    from engine.generate.llm_engine import check_kv_cache_dtype
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ValueError, match="kv_cache_dtype='fp8' needs a GPU of compute capability 8.9.*A100.*8.0"):
        check_kv_cache_dtype(FP8_KV_DTYPE, True, cuda)
    check_kv_cache_dtype(torch.bfloat16, True, cuda)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    check_kv_cache_dtype(FP8_KV_DTYPE, True, cuda)
    check_kv_cache_dtype(FP8_KV_DTYPE, True, torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host syncs are a CUDA matter")
def test_a_graphed_fp8_decode_step_on_cuda_syncs_only_to_read_the_sampled_ids(llama, monkeypatch):
    """As test_paged_attention_engine's check for the 16-bit cache: the store kernel and
    the kernel's fp8 reads inside the captured graph, under CUDA's sync debug mode set to raise."""
    from engine import Engine, SamplingParams
    monkeypatch.delenv("BARGE_ATTENTION_BACKEND", raising=False)
    engine = Engine.from_pretrained(llama, mode="generate", device="cuda", dtype="float32", kv_cache_dtype="fp8",
                                    **OPTIONS)
    llm, runner = engine.llm, engine.llm.runner
    assert runner.graphs is not None and runner.kv_cache[0].is_fp8
    for prompt in ([5, 6, 7], [8, 9, 10, 11, 12]):
        llm.add_request(prompt, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    llm.step()
    batch = runner.prepare(llm.scheduler.schedule())
    assert batch.is_decode_only
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.inference_mode():
            hidden = runner.graphs.run(batch)
            runner.model.compute_logits(hidden[batch.logit_rows])
    finally:
        torch.cuda.set_sync_debug_mode("default")


# The paged kernel (16-bit and fp8 caches; decode and prefill tiles) and the fp8 store,
# compiled to sm_90 cubins (Triton's own ptxas) in bf16, fp16 and fp32: what only a GPU run
# would otherwise show (E4M3 loads and widening are compiled on capability 8.9 and later only).
COMPILE_FOR_SM90 = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from engine.kernels import kv_store, paged_attention

INT_POINTERS = {"query_start_loc_ptr": "*i32", "seq_lens_ptr": "*i32", "block_tables_ptr": "*i32", "slot_ptr": "*i64"}

def argument_type(name, dtype, kv_fp8):
    if name in INT_POINTERS:
        return INT_POINTERS[name]
    if name in ("k_cache_ptr", "v_cache_ptr"):
        return "*fp8e4nv" if kv_fp8 else f"*{dtype}"
    if name in ("k_scale_ptr", "v_scale_ptr"):
        return "*fp32" if kv_fp8 else f"*{dtype}"
    if name.endswith("_ptr"):
        return f"*{dtype}"
    return "fp32" if name == "scale" else "i32"

def compile_for_sm90(kernel, dtype, kv_fp8, constexprs):
    signature = {p.name: "constexpr" if p.is_constexpr else argument_type(p.name, dtype, kv_fp8) for p in kernel.params}
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                              target=GPUTarget("cuda", 90, 32))
    assert compiled.asm["cubin"], (kernel, dtype, kv_fp8)

for dtype in ("bf16", "fp16", "fp32"):
    for kv_fp8 in (True, False):
        for block_q, block_m in ((1, 16), (16, 64)):     # decode tiles, prefill tiles (GQA 4, head_dim 128)
            compile_for_sm90(paged_attention._paged_attention_kernel, dtype, kv_fp8, dict(
                GROUP_SIZE=4, BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=32, HEAD_DIM=128,
                DOT_FP32=dtype == "fp32", KV_FP8=kv_fp8))
    compile_for_sm90(kv_store._store_fp8_kv_kernel, dtype, True,
                     dict(FP8_MAX_=448.0, MIN_SCALE_=1e-12, HEAD_DIM=128))
print("compiled")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the tests above compile and run them")
def test_the_fp8_kernels_compile_for_an_h100_without_one():
    pytest.importorskip("triton.backends.nvidia")
    assert_compiles_without_interpreter(COMPILE_FOR_SM90)
