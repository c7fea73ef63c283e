"""The fused Triton layer ops against the PyTorch ops they replace on CUDA, run on the device
the tests name: CUDA tensors on a GPU, Triton's interpreter on CPU (TRITON_INTERPRET=1, tiny
shapes: the interpreter is slow). Then a whole random decoder on the fused path against the
PyTorch path, greedy tokens equal in fp32."""

import os

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from engine.generate.rotary import apply_rotary  # noqa: E402
from engine.models.llama import RMSNorm  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(scope="module")
def ops():
    # tests/conftest.py turns the interpreter on before triton is imported, on CPU machines.
    if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and TRITON_INTERPRET is not 1")
    from engine.kernels import fused_ops
    return fused_ops


def randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)


def assert_within_rounding(ours: torch.Tensor, expected: torch.Tensor, reference_in_dtype: torch.Tensor):
    """Against the fp32 reference: as close as the PyTorch op in ours' dtype is, plus one
    rounding of that dtype (fp32: 1e-5). Triton's interpreter truncates fp32 -> bf16 where a
    GPU rounds to nearest, which doubles each rounding's error: two there."""
    assert ours.dtype == reference_in_dtype.dtype and ours.shape == expected.shape
    eps = 1e-5 if ours.dtype == torch.float32 else torch.finfo(ours.dtype).eps
    if ours.dtype == torch.bfloat16 and DEVICE == "cpu":
        eps *= 2
    scale = expected.abs().clamp(min=1.0)
    ours_error = ((ours.float() - expected) / scale).abs().max().item()
    torch_error = ((reference_in_dtype.float() - expected) / scale).abs().max().item()
    assert ours_error <= torch_error + eps, (ours_error, torch_error)


def rms_norm_reference(x, weight, eps, dtype):
    norm = RMSNorm(x.shape[-1], eps).to(DEVICE, dtype)
    norm.weight.data.copy_(weight)
    return norm(x.to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 576])       # a power of two, and SmolLM2's (masked to 1,024)
def test_rms_norm_matches_the_pytorch_norm(ops, dtype, hidden):
    x, weight = randn(5, hidden, dtype=dtype, seed=1), randn(hidden, dtype=dtype, seed=2)
    expected = rms_norm_reference(x.float(), weight.float(), 1e-5, torch.float32)
    assert_within_rounding(ops.rms_norm(x, weight, 1e-5), expected, rms_norm_reference(x, weight, 1e-5, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_adds_in_place_as_pytorch_rounds_and_normalises_the_sum(ops, dtype):
    x, residual, weight = randn(7, 96, dtype=dtype, seed=3), randn(7, 96, dtype=dtype, seed=4), randn(96, dtype=dtype, seed=5)
    summed = x + residual                          # PyTorch's add in this dtype: the kernel's must be equal
    expected = rms_norm_reference(summed.float(), weight.float(), 1e-6, torch.float32)
    out = ops.add_rms_norm(x, residual, weight, 1e-6)
    if dtype == torch.bfloat16 and DEVICE == "cpu":
        # The interpreter's truncation (see assert_within_rounding): one ulp apart at most.
        assert ((residual.float() - summed.float()).abs() <= summed.float().abs() * 2.0 ** -7).all()
    else:
        assert torch.equal(residual, summed)
    assert_within_rounding(out, expected, rms_norm_reference(summed, weight, 1e-6, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", [48, 200])     # under one block, and over several with a small block
def test_silu_and_mul_matches_pytorch(ops, dtype, size):
    gate_up = randn(6, 2 * size, dtype=dtype, seed=6) * 3
    gate, up = gate_up.float().split(size, dim=-1)
    in_dtype = gate_up.split(size, dim=-1)
    assert_within_rounding(ops.silu_and_mul(gate_up, block=64), F.silu(gate) * up,
                           F.silu(in_dtype[0]) * in_dtype[1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [16, 24])      # half of 24 is masked inside a 16-wide block
def test_rotary_in_place_on_q_and_k_inside_the_fused_qkv_output(ops, dtype, head_dim):
    num_tokens, num_heads, num_kv_heads = 5, 4, 2
    qkv = randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, dtype=dtype, seed=7)
    angles = torch.arange(num_tokens, device=DEVICE)[:, None].float() * torch.linspace(1.0, 0.01, head_dim // 2,
                                                                                         device=DEVICE)
    angles = torch.cat((angles, angles), dim=-1)[:, None, :]
    cos, sin = angles.cos(), angles.sin()
    heads = qkv.view(num_tokens, -1, head_dim)
    q, k, v = heads[:, :num_heads], heads[:, num_heads:num_heads + num_kv_heads], heads[:, num_heads + num_kv_heads:]
    expected = apply_rotary(q.float(), k.float(), cos, sin)
    in_dtype = apply_rotary(q, k, cos.to(dtype), sin.to(dtype))
    v_before = v.clone()
    ops.rotary_(heads[:, :num_heads + num_kv_heads], cos.to(dtype), sin.to(dtype))
    assert_within_rounding(q, expected[0], in_dtype[0])
    assert_within_rounding(k, expected[1], in_dtype[1])
    assert torch.equal(v, v_before)        # the v heads beside them are not touched


def test_the_ops_refuse_what_they_cannot_run(ops):
    with pytest.raises(ValueError, match="contiguous rows"):
        ops.rms_norm(randn(4, 8).t(), randn(4), 1e-5)
    with pytest.raises(ValueError, match="one shape"):
        ops.add_rms_norm(randn(2, 8), randn(3, 8), randn(8), 1e-5)
    with pytest.raises(ValueError, match="even head_dim"):
        ops.rotary_(randn(2, 1, 5), randn(2, 1, 5), randn(2, 1, 5))


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])     # plain, with a QKV bias, with q/k norms
def test_a_decoder_on_the_fused_path_gives_the_pytorch_path_tokens(ops, family, tmp_path):
    pytest.importorskip("transformers")
    from engine import Engine, SamplingParams
    from tests.support.random_decoders import save_random_decoder

    folder = save_random_decoder(tmp_path, family, num_hidden_layers=1)
    prompts = [[5, 9, 33, 7, 100, 21, 8], [44, 3]]
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=1)
    engines = [Engine.from_pretrained(folder, mode="generate", dtype="float32", num_blocks=16, block_size=4,
                                      device=DEVICE) for _ in range(2)]
    engines[0].llm.runner.model.fused_ops = False       # the PyTorch path, on a GPU too
    engines[1].llm.runner.model.fused_ops = True
    plain, fused = (engine.generate(prompts, params) for engine in engines)
    assert [o.token_ids for o in fused] == [o.token_ids for o in plain]
    for ours, theirs in zip(fused, plain):
        for entry, expected in zip(ours.logprobs, theirs.logprobs):
            assert entry.keys() == expected.keys()
            assert max(abs(entry[t] - expected[t]) for t in entry) <= 1e-4
