"""The grouped LoRA op and its bookkeeping: the slot table's LRU, the step's LoraBatch, the
CPU path (per-slot matmuls) against a token-by-token reference, and the Triton kernels
(TRITON_INTERPRET=1 here, CUDA on a GPU) against the CPU path."""

import os

import pytest
import torch

from engine.lora.adapter import LoraAdapter
from engine.lora.adapter_config import AdapterConfig
from engine.lora.batch import build_lora_batch
from engine.lora.slots import SlotTable
from engine.lora.weights import KernelLoraWeights, Projection, TorchLoraWeights
from tests.support.sm90 import assert_compiles_without_interpreter

CPU = torch.device("cpu")
HIDDEN = 48
# A fused q|k|v linear of a small GQA shape: q 48 columns, k and v 16 each.
QKV = [Projection("q_proj", 0, 48, HIDDEN), Projection("k_proj", 48, 64, HIDDEN), Projection("v_proj", 64, 80, HIDDEN)]


@pytest.mark.parametrize("resident, step, expected_slots, expected_loads, lru_after", [
    ([], ["a", "b"], {"a": 0, "b": 1}, [(0, "a"), (1, "b")], ["a", "b"]),
    (["a", "b", "c"], ["b"], {"b": 1}, [], ["a", "c", "b"]),
    (["a", "b", "c"], ["d"], {"d": 0}, [(0, "d")], ["b", "c", "d"]),                 # a: least recently used
    (["a", "b", "c"], ["a", "d", "e"], {"a": 0, "d": 1, "e": 2}, [(1, "d"), (2, "e")], ["a", "d", "e"]),
    (["a", "b"], ["c", "a"], {"c": 2, "a": 0}, [(2, "c")], ["b", "a", "c"]),          # a free slot before eviction
])
def test_slot_table_keeps_resident_adapters_and_evicts_the_least_recently_used(
        resident, step, expected_slots, expected_loads, lru_after):
    table = SlotTable(3)
    for adapter_id in resident:
        table.assign([adapter_id])
    slots, loads = table.assign(step)
    assert slots == expected_slots and loads == expected_loads
    assert list(table.resident) == lru_after


def test_slot_table_refuses_a_step_with_more_adapters_than_slots():
    with pytest.raises(ValueError, match="3 adapters; max_loras is 2"):
        SlotTable(2).assign(["a", "b", "c"])


SCALINGS = [0.5, 2.0, 1.5, 3.0]


def test_lora_batch_groups_tokens_by_slot_and_leaves_base_tokens_out():
    token_slots = [2, 2, -1, 0, 0, 0, 2, -1]
    batch = build_lora_batch(token_slots, SCALINGS, CPU, torch.float32, for_kernels=False)
    assert [slot for slot, _ in batch.segments] == [0, 2] and batch.num_lora_tokens == 6
    assert batch.segments[0][1] == slice(3, 6)                       # one run: a view, no gather
    assert batch.segments[1][1].tolist() == [0, 1, 6]
    # Slots 0..2 padded to 3 rows each (slot 1, unused, all padding): 9 rows for 6, within 2x.
    assert batch.padded.slots == slice(0, 3) and batch.padded.rows.tolist() == [3, 4, 5, 0, 0, 0, 0, 1, 6]
    assert batch.padded.scales.flatten().tolist() == [0.5] * 3 + [0.0] * 3 + [1.5] * 3
    kernel_batch = build_lora_batch(token_slots, SCALINGS, CPU, torch.float32, for_kernels=True)
    assert kernel_batch.sorted_rows.tolist() == [3, 4, 5, 0, 1, 6]
    assert kernel_batch.slot_starts.tolist() == [0, 3, 3, 6, 6]
    assert build_lora_batch([-1, -1], SCALINGS, CPU, torch.float32, for_kernels=False) is None


def test_slots_laid_out_one_after_another_as_many_rows_each_are_one_run():
    """As the runner lays out a CPU step's decodes (LoraManager.by_slot): slot by slot, base rows last."""
    batch = build_lora_batch([0, 0, 1, 1, 2, 2, -1], SCALINGS, CPU, torch.float32, for_kernels=False)
    assert batch.padded.run == slice(0, 6) and batch.padded.rows is None
    assert batch.padded.scales.flatten().tolist() == [0.5, 0.5, 2.0, 2.0, 1.5, 1.5]
    for token_slots in ([0, 0, 1, 1, 1, 2, 2], [0, 0, 2, 2], [1, 1, 0, 0]):   # uneven, a slot missing, out of order
        padded = build_lora_batch(token_slots, SCALINGS, CPU, torch.float32, for_kernels=False).padded
        assert padded.run is None and padded.rows is not None, token_slots


def test_long_runs_go_run_by_run_on_views_a_slot_perhaps_twice():
    """A prompt step laid out slot by slot behind its decodes (LoraManager.by_slot): each
    slot's decode rows, then its prompt chunk, each a run of the step's rows."""
    token_slots = [0, 0, 1, -1] + [0] * 150 + [1] * 140 + [-1] * 5 + [2] * 80     # 373 rows, 5 runs: >= 64 a run
    batch = build_lora_batch(token_slots, SCALINGS, CPU, torch.float32, for_kernels=False)
    assert batch.padded is None and batch.num_lora_tokens == 373
    assert batch.segments == [(0, slice(0, 2)), (1, slice(2, 3)), (0, slice(4, 154)), (1, slice(154, 294)),
                              (2, slice(299, 379))]
    decodes = build_lora_batch([0, 0, 1, 1] * 40, SCALINGS, CPU, torch.float32, for_kernels=False)
    assert decodes.padded is not None        # short runs: gathered into the slots' bmm


def test_a_step_is_laid_out_by_slot_and_adapters_not_yet_in_a_slot_each_together():
    from types import SimpleNamespace
    from engine.lora.manager import LoraManager
    table = SlotTable(4)
    table.assign(["b", "a"])                            # b in slot 0, a in slot 1
    names = ["c", None, "a", "d", "b", "c", "a", None, "d", "b"]
    requests = [SimpleNamespace(name=name, adapter=name and SimpleNamespace(adapter_id=name)) for name in names]
    laid_out = LoraManager.by_slot(SimpleNamespace(slot_table=table), requests)
    assert [request.name for request in laid_out] == ["b", "b", "a", "a", "c", "c", "d", "d", None, None]


def test_a_skewed_step_goes_slot_by_slot():
    """A 10-token prompt chunk beside one decode: padding both to 10 rows would double the work."""
    batch = build_lora_batch([1] * 10 + [3], SCALINGS, CPU, torch.float32, for_kernels=False)
    assert batch.padded is None and batch.segments == [(1, slice(0, 10)), (3, slice(10, 11))]


def random_adapter(name: str, rank: int, projections: list[str], seed: int, dtype=torch.float32) -> LoraAdapter:
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for projection in projections:
        out = next(p.col_end - p.col_start for p in QKV if p.name == projection)
        weights[(0, projection)] = (torch.randn(rank, HIDDEN, generator=generator).to(dtype),
                                    torch.randn(out, rank, generator=generator).to(dtype))
    return LoraAdapter(name, name, AdapterConfig(rank, lora_alpha=rank * 1.5, use_rslora=False), weights)


# Ranks 4, 16 and 9 (not a power of two); one adapter leaves k alone.
ADAPTERS = [random_adapter("a", 4, ["q_proj", "k_proj", "v_proj"], 1),
            random_adapter("b", 16, ["q_proj", "v_proj"], 2),
            random_adapter("c", 9, ["q_proj", "k_proj", "v_proj"], 3)]
TOKEN_SLOTS = [1, 1, -1, 0, 2, 2, 2, -1] + [0] * 19 + [1]       # decodes and a prompt chunk: skewed
BALANCED = [1, 0, -1, 2, 2, 0, 1, -1, 0, 2, 1, 1]                                  # decodes of three adapters
IN_A_RUN = [-1, 0, 0, 0, 1, 1, 1, 2, 2, 2, -1]                  # the same, laid out slot by slot: views, in place
LONG_RUNS = [1] * 90 + [0] * 3 + [-1] * 2 + [0] * 90 + [2] * 80    # prompt chunks by slot: run by run, views


def reference_delta(x: torch.Tensor, token_slots: list[int]) -> torch.Tensor:
    """Token by token, PEFT's arithmetic: (x A^T) B^T * scaling into each projection's columns."""
    y = torch.zeros(x.shape[0], QKV[-1].col_end, dtype=torch.float64)
    for row, slot in enumerate(token_slots):
        if slot < 0:
            continue
        adapter = ADAPTERS[slot]
        for projection in QKV:
            pair = adapter.weights.get((0, projection.name))
            if pair is not None:
                a, b = (tensor.double() for tensor in pair)
                y[row, projection.col_start:projection.col_end] = (x[row].double() @ a.T @ b.T) * adapter.config.scaling
    return y


def filled(weights, adapters=ADAPTERS):
    for slot, adapter in enumerate(adapters):
        weights.load(slot, adapter, layer=0)
    return weights


def torch_weights(adapters=ADAPTERS):
    return filled(TorchLoraWeights(QKV, num_slots=4, rank=16, dtype=adapters[0].weights[(0, "q_proj")][0].dtype),
                  adapters)


@pytest.mark.parametrize("token_slots, is_padded", [(TOKEN_SLOTS, False), (BALANCED, True), (IN_A_RUN, True),
                                                     (LONG_RUNS, False)])
def test_cpu_path_adds_each_tokens_adapter_delta_and_nothing_to_base_tokens(token_slots, is_padded):
    x = torch.randn(len(token_slots), HIDDEN, generator=torch.Generator().manual_seed(0))
    base = torch.randn(len(token_slots), QKV[-1].col_end, generator=torch.Generator().manual_seed(1))
    y = base.clone()
    batch = build_lora_batch(token_slots, [a.config.scaling for a in ADAPTERS] + [0.0], CPU, torch.float32, False)
    assert (batch.padded is not None) is is_padded
    assert (is_padded and batch.padded.run is not None) is (token_slots is IN_A_RUN)
    torch_weights().add_to(y, x, batch)
    torch.testing.assert_close((y - base).double(), reference_delta(x, token_slots), atol=2e-4, rtol=1e-5)
    base_rows = [row for row, slot in enumerate(token_slots) if slot < 0]
    assert torch.equal(y[base_rows], base[base_rows])          # base rows: untouched, bit for bit


def test_a_reloaded_slot_serves_its_new_adapter():
    weights = torch_weights()
    weights.load(0, ADAPTERS[2], layer=0)               # slot 0 now holds c (rank 9 where a had 4)
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(0))
    y = torch.zeros(3, QKV[-1].col_end)
    scalings = [ADAPTERS[2].config.scaling, 0.0, 0.0, 0.0]
    weights.add_to(y, x, build_lora_batch([0, 0, 0], scalings, CPU, torch.float32, False))
    torch.testing.assert_close(y.double(), reference_delta(x, [2, 2, 2]), atol=2e-4, rtol=1e-5)


@pytest.fixture(scope="module")
def device():
    if torch.cuda.is_available():
        return torch.device("cuda")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and TRITON_INTERPRET is not 1")
    return CPU


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_kernels_equal_the_cpu_path(device, dtype):
    pytest.importorskip("triton")
    adapters = [random_adapter(a.source, a.rank, sorted({p for _, p in a.weights}), seed, dtype)
                for seed, a in enumerate(ADAPTERS, start=1)]
    x = torch.randn(len(TOKEN_SLOTS), HIDDEN, generator=torch.Generator().manual_seed(0)).to(dtype)
    base = torch.randn(len(TOKEN_SLOTS), QKV[-1].col_end, generator=torch.Generator().manual_seed(1)).to(dtype)
    expected, scalings = base.clone(), [a.config.scaling for a in adapters] + [0.0]
    torch_weights(adapters).add_to(expected, x, build_lora_batch(TOKEN_SLOTS, scalings, CPU, dtype, False))
    y = base.to(device)
    kernel_weights = filled(KernelLoraWeights(QKV, num_slots=4, rank=16, dtype=dtype, device=device), adapters)
    kernel_weights.add_to(y, x.to(device), build_lora_batch(TOKEN_SLOTS, scalings, device, dtype, True))
    tolerance = dict(atol=1e-4, rtol=1e-5) if dtype == torch.float32 else dict(atol=0.25, rtol=2e-2)
    torch.testing.assert_close(y.cpu(), expected, **tolerance)
    assert torch.equal(y.cpu()[[2, 7]], base[[2, 7]])


COMPILE_FOR_SM90 = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from engine.lora import triton_ops as ops

def argument_type(name, dtype):
    if name in ("rows_ptr", "starts_ptr"):
        return "*i32"
    if name in ("t_ptr", "scale_ptr"):
        return "*fp32"
    return f"*{dtype}" if name.endswith("_ptr") else "i32"

for kernel, constexprs in ((ops._shrink_kernel, dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64)),
                           (ops._expand_kernel, dict(BLOCK_M=64, BLOCK_N=64, BLOCK_R=64))):
    for dtype in ("fp16", "bf16", "fp32"):
        signature = {p.name: "constexpr" if p.is_constexpr else argument_type(p.name, dtype) for p in kernel.params}
        values = {**constexprs, **({"DOT_FP32": dtype == "fp32"} if "DOT_FP32" in signature else {})}
        compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=values),
                                  target=GPUTarget("cuda", 90, 32))
        assert compiled.asm["cubin"], (kernel, dtype)
print("compiled")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernel test above compiles and runs them")
def test_the_kernels_compile_for_an_h100_without_one():
    pytest.importorskip("triton.backends.nvidia")
    assert_compiles_without_interpreter(COMPILE_FOR_SM90)
