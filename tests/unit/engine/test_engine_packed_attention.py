"""packed_attention, varlen_attention and band_masks against plain attention run one text at a
time: both CPU paths (the compiled kernel over the whole batch, and SDPA per group), and the
GPU path (the Triton kernel over the whole batch) on CUDA tensors where there is a GPU, else
by Triton's interpreter on CPU tensors with the device check forced open."""

import os

import pytest
import torch
import torch.nn.functional as F

from engine.embed.batching import attention_groups
from engine.layers import attention
from engine.kernels import cpu_ops
from engine.layers.attention import (attend_one_row_per_text, band_masks, packed_attention, sliding_window,
                                    varlen_attention)

HEAD_DIM = 8


def one_text_at_a_time(q, k, v, seq_lens, is_causal=False, half_window=None):
    """The reference: each text alone, its mask written out in full."""
    outputs, start = [], 0
    for seq_len in seq_lens:
        rows = slice(start, start + seq_len)
        positions = torch.arange(seq_len)
        allowed = torch.ones(seq_len, seq_len, dtype=torch.bool)
        if is_causal:
            allowed &= positions[:, None] >= positions[None, :]
        if half_window is not None:
            allowed &= (positions[:, None] - positions[None, :]).abs() <= half_window
        keys = k[rows].repeat_interleave(q.shape[1] // k.shape[1], dim=1)      # grouped-query heads
        values = v[rows].repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        out = F.scaled_dot_product_attention(q[rows].transpose(0, 1), keys.transpose(0, 1),
                                             values.transpose(0, 1), attn_mask=allowed)
        outputs.append(out.transpose(0, 1))
        start += seq_len
    return torch.cat(outputs)


def random_qkv(num_tokens, num_heads, num_kv_heads):
    torch.manual_seed(0)
    return (torch.randn(num_tokens, num_heads, HEAD_DIM), torch.randn(num_tokens, num_kv_heads, HEAD_DIM),
            torch.randn(num_tokens, num_kv_heads, HEAD_DIM))


@pytest.fixture(params=["cpu-kernel", "sdpa"])
def cpu_path(request, monkeypatch):
    """Each CPU test runs twice: through the compiled kernel, and with it turned off."""
    if request.param == "cpu-kernel":
        if not cpu_ops.cpu_kernels_available():
            pytest.skip("the CPU kernels could not be built here")
    else:
        monkeypatch.setattr(attention, "cpu_kernel_runs_on", lambda x: False)
    return request.param


@pytest.mark.parametrize("is_causal, half_window, num_kv_heads", [
    (False, None, 4),     # BERT-style, unfused
    (True, None, 4),      # decoder
    (True, None, 2),      # decoder with grouped-query attention
    (False, 2, 4),        # ModernBERT local layer
    (True, 2, 1),         # both limits at once
])
def test_matches_one_text_at_a_time(cpu_path, is_causal, half_window, num_kv_heads):
    seq_lens = [1, 3, 3, 6, 9, 9]
    q, k, v = random_qkv(sum(seq_lens), 4, num_kv_heads)
    groups = attention_groups(seq_lens)
    window = sliding_window(groups, half_window, q) if half_window is not None else None
    assert window is None or (window.masks is None) == (cpu_path == "cpu-kernel")
    ours = packed_attention(q, k, v, groups, window, is_causal=is_causal)
    expected = one_text_at_a_time(q, k, v, seq_lens, is_causal, half_window)
    assert torch.allclose(ours, expected, atol=1e-5)


def test_texts_within_the_band_need_no_mask():
    groups = attention_groups([2, 3, 3, 4, 7])
    masks = band_masks(groups, 2, torch.device("cpu"))
    assert [mask is None for mask in masks] == [True, True, False, False]
    assert masks[2].shape == (4, 4) and not masks[2][0, 3] and masks[2][0, 2]
    assert masks[3].shape == (7, 7)


def test_strided_views_of_a_fused_projection_are_taken_as_they_are(cpu_path):
    """v is a view into a fused q|k|v projection (ModernBERT's Wqkv): no copy needed first."""
    seq_lens = [2, 5, 5]
    torch.manual_seed(1)
    qkv = torch.randn(sum(seq_lens), 3 * 2 * HEAD_DIM)
    q, k, v = qkv.view(-1, 3, 2, HEAD_DIM).unbind(1)
    ours = packed_attention(q, k, v, attention_groups(seq_lens))
    expected = one_text_at_a_time(q.contiguous(), k.contiguous(), v.contiguous(), seq_lens)
    assert torch.allclose(ours, expected, atol=1e-5)


# The GPU path runs on the device its tensors are on: CUDA where there is a GPU (the
# compiled kernel, which takes no CPU tensor), else CPU tensors through Triton's interpreter.
KERNEL_DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def kernel_path(monkeypatch):
    """The GPU path on KERNEL_DEVICE: compiled on a GPU; without one, interpreted
    (tests/conftest.py sets TRITON_INTERPRET=1) once the device check lets CPU tensors in."""
    pytest.importorskip("triton")
    if KERNEL_DEVICE.type == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("no GPU and TRITON_INTERPRET is not 1")
        monkeypatch.setattr(attention, "kernel_runs_on", lambda device, head_dim=128: True)
    return KERNEL_DEVICE


@pytest.mark.parametrize("is_causal, half_window, num_kv_heads", [(False, None, 4), (True, None, 2), (False, 2, 4)])
def test_the_kernel_path_matches_one_text_at_a_time(kernel_path, is_causal, half_window, num_kv_heads):
    seq_lens = [1, 3, 3, 6, 9, 9]
    q, k, v = random_qkv(sum(seq_lens), 4, num_kv_heads)
    groups = attention_groups(seq_lens)
    on_device = [x.to(kernel_path) for x in (q, k, v)]
    window = sliding_window(groups, half_window, on_device[0]) if half_window is not None else None
    assert window is None or window.masks is None            # the kernel applies the band itself
    ours = packed_attention(*on_device, groups, window, is_causal=is_causal)
    expected = one_text_at_a_time(q, k, v, seq_lens, is_causal, half_window)
    assert ours.device.type == kernel_path.type
    assert torch.allclose(ours.cpu(), expected, atol=1e-5)


def test_the_kernel_path_takes_bert_fused_qkv_and_the_batch_cu_seqlens(kernel_path):
    seq_lens, num_heads = [2, 5, 5, 11], 2
    torch.manual_seed(2)
    qkv = torch.randn(sum(seq_lens), 3 * num_heads * HEAD_DIM)
    groups = attention_groups(seq_lens)
    cu_seqlens = torch.tensor([0, 2, 7, 12, 23], dtype=torch.int32, device=kernel_path)
    ours = varlen_attention(qkv.to(kernel_path), groups, num_heads, cu_seqlens)
    q, k, v = (x.contiguous() for x in qkv.view(-1, 3, num_heads, HEAD_DIM).unbind(1))
    expected = one_text_at_a_time(q, k, v, seq_lens).flatten(1)
    assert ours.shape == (sum(seq_lens), num_heads * HEAD_DIM) and ours.device.type == kernel_path.type
    assert torch.allclose(ours.cpu(), expected, atol=1e-5)


def test_bert_fused_qkv_on_cpu(cpu_path):
    seq_lens, num_heads = [2, 5, 5, 11], 2
    torch.manual_seed(2)
    qkv = torch.randn(sum(seq_lens), 3 * num_heads * HEAD_DIM)
    ours = varlen_attention(qkv, attention_groups(seq_lens), num_heads)
    q, k, v = (x.contiguous() for x in qkv.view(-1, 3, num_heads, HEAD_DIM).unbind(1))
    assert torch.allclose(ours, one_text_at_a_time(q, k, v, seq_lens).flatten(1), atol=1e-5)


@pytest.mark.parametrize("pick", ["first", "last", "middle"])
def test_one_row_per_text_is_that_rows_output_of_the_whole_attention(pick):
    """A head that pools one token per text (a cross-encoder's [CLS]) attends only from it."""
    seq_lens, num_heads = [1, 2, 5, 5, 11, 11, 11], 2
    torch.manual_seed(3)
    qkv = torch.randn(sum(seq_lens), 3 * num_heads * HEAD_DIM)
    starts = torch.cumsum(torch.tensor([0] + seq_lens[:-1]), 0)
    offsets = {"first": [0] * len(seq_lens), "last": [n - 1 for n in seq_lens], "middle": [n // 2 for n in seq_lens]}
    rows = starts + torch.tensor(offsets[pick])
    q, k, v = (x.contiguous() for x in qkv.view(-1, 3, num_heads, HEAD_DIM).unbind(1))
    expected = one_text_at_a_time(q, k, v, seq_lens).flatten(1)[rows]
    ours = attend_one_row_per_text(qkv, attention_groups(seq_lens), num_heads, rows)
    assert ours.shape == (len(seq_lens), num_heads * HEAD_DIM)
    assert torch.allclose(ours, expected, atol=1e-5)


def avx2_build():
    """varlen_attention built for AVX2 alone (as on an AVX2-only CPU), beside the native
    AVX-512 build, under its own op namespace; None where the native build is AVX2 already."""
    if not cpu_ops.cpu_kernels_available():
        pytest.skip("the CPU kernels could not be built here")
    if "avx512f" not in cpu_ops._cpu_features().decode():
        return None
    from torch.utils import cpp_extension

    source = cpu_ops.SOURCES[1]
    cpp_extension.load(name=f"barge_avx2_{cpu_ops._build_name()[-12:]}", sources=[str(source)], is_python_module=False,
                       extra_cflags=[*cpu_ops.CFLAGS, "-mno-avx512f", "-DBARGE_OPS_NAMESPACE=barge_cpu_avx2"],
                       extra_ldflags=["-fopenmp"])
    return torch.ops.barge_cpu_avx2.varlen_attention


@pytest.fixture(scope="module", params=["native", "avx2"])
def cpu_kernel(request):
    """The kernel as this CPU builds it, and (on an AVX-512 CPU) as an AVX2-only CPU would."""
    if request.param == "native":
        if not cpu_ops.cpu_kernels_available():
            pytest.skip("the CPU kernels could not be built here")
        return torch.ops.barge_cpu.varlen_attention
    kernel = avx2_build()
    if kernel is None:
        pytest.skip("this CPU's native build is the AVX2 one")
    return kernel


@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim",
                         [(12, 12, 32), (8, 2, 64), (4, 4, 20), (3, 3, 48), (2, 1, 128)])
@pytest.mark.parametrize("is_causal, half_window", [(False, None), (True, None), (False, 7), (True, 40)])
def test_the_cpu_kernel_at_encoder_shapes(cpu_kernel, num_heads, num_kv_heads, head_dim, is_causal, half_window):
    """Lengths around the kernel's vectors (8 floats with AVX2, 16 with AVX-512), key tiles
    (16, 32) and query tiles (6, 12), an empty text, one past 256 tokens; head_dims that
    take each of its P·V tiles (4, 2 and 1 vectors) and its scalar tail (20)."""
    seq_lens = [1, 5, 8, 9, 12, 13, 16, 17, 31, 32, 33, 63, 64, 65, 130, 0, 300]
    torch.manual_seed(3)
    qkv = torch.randn(sum(seq_lens), num_heads + 2 * num_kv_heads, head_dim)
    q, k, v = qkv[:, :num_heads], qkv[:, num_heads:num_heads + num_kv_heads], qkv[:, num_heads + num_kv_heads:]
    cu_seqlens = torch.tensor([0, *torch.tensor(seq_lens).cumsum(0).tolist()])
    ours = cpu_kernel(q, k, v, cu_seqlens, head_dim ** -0.5, is_causal, -1 if half_window is None else half_window)
    nonempty = [n for n in seq_lens if n]
    expected = one_text_at_a_time(q, k, v, nonempty, is_causal, half_window)
    assert torch.allclose(ours, expected, atol=1e-5)


def test_the_cpu_kernel_refuses_what_it_cannot_read():
    if not cpu_ops.cpu_kernels_available():
        pytest.skip("the CPU kernels could not be built here")
    q = torch.randn(6, 2, 8)
    with pytest.raises(RuntimeError, match="float32"):
        cpu_ops.varlen_attention(q.double(), q.double(), q.double(), torch.tensor([0, 6]), 1.0)
    with pytest.raises(RuntimeError, match="num_tokens"):
        cpu_ops.varlen_attention(q, q, q, torch.tensor([0, 5]), 1.0)
    with pytest.raises(RuntimeError, match="contiguous"):
        cpu_ops.varlen_attention(q.transpose(1, 2), q, q, torch.tensor([0, 6]), 1.0)


def test_cpu_tensors_never_take_triton_and_the_head_dim_limit_matches_it():
    assert not attention.kernel_runs_on(torch.device("cpu"))
    triton_kernel = pytest.importorskip("engine.kernels.varlen_attention")
    assert attention.KERNEL_MAX_HEAD_DIM == triton_kernel.MAX_HEAD_DIM


def test_a_build_for_one_cpu_is_not_loaded_on_another(monkeypatch):
    """-march=native: a build on an AVX-512 CPU would die of an illegal instruction on an
    AVX2-only one that shares the build cache, so the CPU's flags name the build."""
    if os.path.exists("/proc/cpuinfo"):
        assert b"flags" in cpu_ops._cpu_features()
    here = cpu_ops._build_name()
    monkeypatch.setattr(cpu_ops, "_cpu_features", lambda: b"model name\t: another\nflags\t\t: fpu avx2 fma")
    assert cpu_ops._build_name() != here


def test_bf16_bert_attention_on_cpu_takes_the_fp32_kernel_widened(monkeypatch):
    """The embedder's bf16 path: q|k|v widened for the compiled fp32 kernel, the output in
    bf16 within its rounding of the fp32 result; SDPA per group is not called."""
    if not cpu_ops.cpu_kernels_available():
        pytest.skip("the CPU kernels could not be built here")
    seq_lens, num_heads = [2, 5, 5, 11], 2
    torch.manual_seed(2)
    qkv = torch.randn(sum(seq_lens), 3 * num_heads * HEAD_DIM).to(torch.bfloat16)
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", None)     # any SDPA call fails
    ours = varlen_attention(qkv, attention_groups(seq_lens), num_heads)
    monkeypatch.undo()
    q, k, v = (x.float().contiguous() for x in qkv.view(-1, 3, num_heads, HEAD_DIM).unbind(1))
    expected = one_text_at_a_time(q, k, v, seq_lens).flatten(1)
    assert ours.dtype == torch.bfloat16
    assert torch.allclose(ours.float(), expected, atol=1e-2)
