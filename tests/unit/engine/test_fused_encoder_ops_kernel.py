"""The encoders' fused Triton ops (engine/kernels/fused_encoder_ops.py) against the PyTorch ops
they replace on CUDA, run on the device the tests name: CUDA tensors on a GPU, Triton's
interpreter on CPU (TRITON_INTERPRET=1; a few rows: the interpreter is slow). Hidden sizes
MiniLM's (384), BERT-base's (768) and one that is no power of two (1000, masked to 1024);
fp32 within 1e-5 of the fp32 reference, fp16 and bf16 within the PyTorch op's own error in
that dtype plus one rounding of it."""

import os

import pytest
import torch
import torch.nn.functional as F

from tests.support.sm90 import assert_compiles_without_interpreter

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HIDDEN_SIZES = [384, 768, 1000]
NUM_ROWS = 5


@pytest.fixture(scope="module")
def ops():
    # tests/conftest.py turns the interpreter on before triton is imported, on CPU machines.
    if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and TRITON_INTERPRET is not 1")
    from engine.kernels import fused_encoder_ops
    return fused_encoder_ops


def randn(*shape, dtype=torch.float32, seed=0, scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(DEVICE, dtype)


def assert_within_rounding(ours: torch.Tensor, expected: torch.Tensor, reference_in_dtype: torch.Tensor):
    """Against the fp32 reference: as close as the PyTorch ops in ours' dtype are, plus one
    rounding of that dtype (fp32: 1e-5). Triton's interpreter truncates fp32 -> bf16 where a
    GPU rounds to nearest, which doubles each rounding's error: two there."""
    assert ours.dtype == reference_in_dtype.dtype and ours.shape == expected.shape
    assert ours.device == expected.device
    eps = 1e-5 if ours.dtype == torch.float32 else torch.finfo(ours.dtype).eps
    if ours.dtype == torch.bfloat16 and DEVICE == "cpu":
        eps *= 2
    scale = expected.abs().clamp(min=1.0)
    ours_error = ((ours.float() - expected) / scale).abs().max().item()
    torch_error = ((reference_in_dtype.float() - expected) / scale).abs().max().item()
    assert ours_error <= torch_error + eps, (ours_error, torch_error)


def norm_params(hidden, dtype, seed):
    return randn(hidden, dtype=dtype, seed=seed, scale=0.5) + 1, randn(hidden, dtype=dtype, seed=seed + 1, scale=0.1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN_SIZES)
def test_layer_norm_of_a_biased_product_and_its_residual_as_bert_adds_them(ops, dtype, hidden):
    """BERT's post-norm: LayerNorm(x W + b + residual), the product x W handed over unbiased."""
    x, residual = randn(NUM_ROWS, hidden, dtype=dtype, seed=1), randn(NUM_ROWS, hidden, dtype=dtype, seed=2, scale=3)
    x_bias = randn(hidden, dtype=dtype, seed=3)
    weight, bias = norm_params(hidden, dtype, seed=4)
    residual_before = residual.clone()

    def reference(x, residual, x_bias, weight, bias):
        return F.layer_norm(x + x_bias + residual, (hidden,), weight, bias, eps=1e-12)

    out = ops.layer_norm(x, weight, bias, 1e-12, residual=residual, x_bias=x_bias)
    expected = reference(*(t.float() for t in (x, residual, x_bias, weight, bias)))
    assert_within_rounding(out, expected, reference(x, residual, x_bias, weight, bias))
    assert torch.equal(residual, residual_before)       # only the output is written


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_alone_without_a_norm_bias(ops, dtype):
    x, (weight, _) = randn(NUM_ROWS, 1000, dtype=dtype, seed=5, scale=4), norm_params(1000, dtype, seed=6)
    expected = F.layer_norm(x.float(), (1000,), weight.float(), None, eps=1e-5)
    assert_within_rounding(ops.layer_norm(x, weight, None, 1e-5), expected,
                           F.layer_norm(x, (1000,), weight, None, eps=1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN_SIZES)
def test_add_layer_norm_adds_in_place_as_pytorch_rounds_and_normalises_the_sum(ops, dtype, hidden):
    """ModernBERT's pre-norm: the residual stream takes the sublayer's output, then is normalised."""
    x, residual = randn(NUM_ROWS, hidden, dtype=dtype, seed=7), randn(NUM_ROWS, hidden, dtype=dtype, seed=8, scale=3)
    weight, bias = norm_params(hidden, dtype, seed=9)
    summed = residual + x                       # PyTorch's add in this dtype: the kernel's must be equal
    out = ops.add_layer_norm_(x, residual, weight, bias, 1e-5)
    if dtype == torch.bfloat16 and DEVICE == "cpu":
        # The interpreter's truncation (see assert_within_rounding): one ulp apart at most.
        assert ((residual.float() - summed.float()).abs() <= summed.float().abs() * 2.0 ** -7).all()
    else:
        assert torch.equal(residual, summed)
    expected = F.layer_norm(summed.float(), (hidden,), weight.float(), bias.float(), eps=1e-5)
    assert_within_rounding(out, expected, F.layer_norm(summed, (hidden,), weight, bias, eps=1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_layer_norm_folds_the_linear_bias_into_the_stored_sum(ops, dtype):
    x, residual, x_bias = randn(3, 384, dtype=dtype, seed=10), randn(3, 384, dtype=dtype, seed=11), randn(384, seed=12)
    x_bias = x_bias.to(dtype)
    weight, bias = norm_params(384, dtype, seed=13)
    exact_sum, summed = x.float() + x_bias.float() + residual.float(), (x + x_bias) + residual
    out = ops.add_layer_norm_(x, residual, weight, bias, 1e-5, x_bias=x_bias)
    assert_within_rounding(residual, exact_sum, summed)
    expected = F.layer_norm(exact_sum, (384,), weight.float(), bias.float(), eps=1e-5)
    assert_within_rounding(out, expected, F.layer_norm(summed, (384,), weight, bias, eps=1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [384, 1000])
def test_embedding_layer_norm_gathers_and_sums_bert_s_three_tables(ops, dtype, hidden):
    vocab, max_positions, offset = 50, 40, 2          # RoBERTa-style: positions start past the padding row
    word, position_table = randn(vocab, hidden, dtype=dtype, seed=14), randn(max_positions, hidden, dtype=dtype, seed=15)
    type_row = randn(hidden, dtype=dtype, seed=16, scale=0.5)
    weight, bias = norm_params(hidden, dtype, seed=17)
    input_ids = torch.tensor([3, 49, 0, 7, 7, 21, 1], device=DEVICE)
    positions = torch.tensor([0, 1, 2, 0, 1, 0, 37], device=DEVICE)

    def reference(word, position_table, type_row, weight, bias):
        summed = F.embedding(input_ids, word) + F.embedding(positions + offset, position_table) + type_row
        return F.layer_norm(summed, (hidden,), weight, bias, eps=1e-12)

    out = ops.embedding_layer_norm(input_ids, word, weight, bias, 1e-12, positions=positions,
                                   position_table=position_table, position_offset=offset, row=type_row)
    expected = reference(*(t.float() for t in (word, position_table, type_row, weight, bias)))
    assert_within_rounding(out, expected, reference(word, position_table, type_row, weight, bias))


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_layer_norm_of_the_word_table_alone(ops, dtype):
    """ModernBERT's embeddings: no position table, no norm bias."""
    word, (weight, _) = randn(30, 384, dtype=dtype, seed=18), norm_params(384, dtype, seed=19)
    input_ids = torch.tensor([29, 0, 5, 5], device=DEVICE)
    expected = F.layer_norm(F.embedding(input_ids, word.float()), (384,), weight.float(), None, eps=1e-5)
    assert_within_rounding(ops.embedding_layer_norm(input_ids, word, weight, None, 1e-5), expected,
                           F.layer_norm(F.embedding(input_ids, word), (384,), weight, None, eps=1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("size", [1536, 1000])     # MiniLM's intermediate size, and one that ends mid-block
def test_bias_gelu_in_place_matches_pytorch(ops, dtype, approximate, size):
    x, bias = randn(NUM_ROWS, size, dtype=dtype, seed=20, scale=3), randn(size, dtype=dtype, seed=21)
    expected = F.gelu(x.float() + bias.float(), approximate=approximate)
    reference_in_dtype = F.gelu(x + bias, approximate=approximate)
    out = ops.bias_gelu_(x, bias, approximate)
    assert out.data_ptr() == x.data_ptr()
    assert_within_rounding(out, expected, reference_in_dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("has_bias", [False, True])    # ModernBERT's Wi has a bias only with mlp_bias
@pytest.mark.parametrize("size", [1000, 1152])         # one masked block; ModernBERT-base's, five of 256
def test_gelu_and_mul_matches_modernbert_s_geglu(ops, dtype, has_bias, size):
    x = randn(NUM_ROWS, 2 * size, dtype=dtype, seed=22, scale=3)
    bias = randn(2 * size, dtype=dtype, seed=23) if has_bias else None

    def reference(x, bias):
        inner, gate = (x if bias is None else x + bias).chunk(2, dim=-1)
        return F.gelu(inner) * gate

    expected = reference(x.float(), bias.float() if has_bias else None)
    assert_within_rounding(ops.gelu_and_mul(x, bias), expected, reference(x, bias))


def test_the_ops_refuse_what_they_cannot_run(ops):
    with pytest.raises(ValueError, match="contiguous rows"):
        ops.layer_norm(randn(4, 8).t(), randn(4), None, 1e-5)
    with pytest.raises(ValueError, match="one shape and dtype"):
        ops.add_layer_norm_(randn(2, 8), randn(3, 8), randn(8), None, 1e-5)
    with pytest.raises(ValueError, match="contiguous rows"):
        ops.bias_gelu_(randn(8, 4).t(), None)
    with pytest.raises(ValueError, match="unsupported GELU approximate 'erf'"):
        ops.gelu_and_mul(randn(2, 8), None, "erf")
    with pytest.raises(ValueError, match="come together"):
        ops.embedding_layer_norm(torch.tensor([0], device=DEVICE), randn(3, 8), randn(8), None, 1e-5,
                                 positions=torch.tensor([0], device=DEVICE))


# Each kernel compiled to an sm_90 cubin (Triton's own ptxas) in fp16, bf16 and fp32, its
# flags all on and all off: what only a GPU run would otherwise show. Integer arguments
# are i32, eps fp32, token ids and positions int64, every other pointer the dtype's.
COMPILE_FOR_SM90 = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from engine.kernels import fused_encoder_ops as ops

def argument_type(name, dtype):
    if name in ("ids_ptr", "positions_ptr"):
        return "*i64"
    return f"*{dtype}" if name.endswith("_ptr") else "fp32" if name == "eps" else "i32"

for kernel in (ops._layer_norm_kernel, ops._embedding_layer_norm_kernel, ops._bias_gelu_kernel,
               ops._gelu_and_mul_kernel):
    for dtype in ("fp16", "bf16", "fp32"):
        for flag in (True, False):
            signature = {p.name: "constexpr" if p.is_constexpr else argument_type(p.name, dtype) for p in kernel.params}
            constexprs = {p.name: 512 if p.name == "BLOCK" else flag for p in kernel.params if p.is_constexpr}
            compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                                      target=GPUTarget("cuda", 90, 32))
            assert compiled.asm["cubin"], (kernel, dtype, flag)
print("compiled")
"""


@pytest.mark.skipif(DEVICE == "cuda", reason="on a GPU the tests above compile and run them")
def test_the_kernels_compile_for_an_h100_without_one():
    pytest.importorskip("triton.backends.nvidia")
    assert_compiles_without_interpreter(COMPILE_FOR_SM90)

