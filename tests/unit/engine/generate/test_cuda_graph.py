"""CudaGraphRunner's buffer handling, on CPU with capture off: the buckets, what a step
copies into the static buffers and what padding rows hold, buffers reused across steps of
different sizes, and a decode step through the buffers giving the eager step's result."""

import os

import pytest
import torch

from engine.generate.attention import AttentionMetadata, FlatMetadata
from engine.generate.cuda_graph import CudaGraphRunner, graph_batch_sizes
from engine.generate.runner import ForwardBatch

PADDING_SLOT = 999
MAX_BLOCKS = 6


@pytest.mark.parametrize("max_num_seqs, sizes", [
    (1, [1]),
    (8, [1, 2, 4, 8]),
    (100, [1, 2, 4, 8, 16, 32, 64, 100]),       # the limit itself, not 128: a batch never exceeds it
    (256, [1, 2, 4, 8, 16, 32, 64, 128, 256]),
    (1000, [1, 2, 4, 8, 16, 32, 64, 128, 256]),  # larger decode batches run eagerly
])
def test_buckets_are_bounded_by_max_num_seqs(max_num_seqs, sizes):
    assert graph_batch_sizes(max_num_seqs) == sizes


class RecordingForward:
    """A forward that keeps a copy of what it was handed and returns a row-wise function of it."""

    def __init__(self):
        self.calls = []

    def __call__(self, input_ids, positions, meta, kv_cache):
        flat = meta.flat
        self.calls.append(dict(input_ids=input_ids.clone(), positions=positions.clone(),
                               slot_mapping=meta.slot_mapping.clone(), seq_lens=flat.seq_lens.clone(),
                               block_tables=flat.block_tables.clone(), query_start_loc=flat.query_start_loc.clone(),
                               max_query_len=flat.max_query_len, pointers=(input_ids.data_ptr(), flat.seq_lens.data_ptr())))
        return (input_ids * 1000 + positions)[:, None].float().expand(-1, 2)


def decode_batch(num_seqs, width, seed):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 500, (num_seqs,), generator=generator)
    positions = torch.randint(0, 20, (num_seqs,), generator=generator)
    tables = torch.randint(1, 50, (num_seqs, width), generator=generator, dtype=torch.int32)
    flat = FlatMetadata(torch.arange(num_seqs + 1, dtype=torch.int32), (positions + 1).to(torch.int32), tables, 1)
    meta = AttentionMetadata(torch.randint(0, 200, (num_seqs,), generator=generator), [], [], flat)
    return ForwardBatch(ids, positions, meta, [], [], {}, positions.tolist())


def test_a_step_is_copied_in_padded_to_its_bucket_and_read_out():
    forward = RecordingForward()
    graphs = CudaGraphRunner(forward, [], 8, MAX_BLOCKS, PADDING_SLOT, torch.device("cpu"), capture=True)
    assert not graphs.is_capturing                   # no CUDA graphs on CPU, whatever is asked
    batch = decode_batch(3, 4, seed=1)
    hidden = graphs.run(batch)
    call = forward.calls[-1]
    assert graphs.bucket_for(3) == 4 and call["input_ids"].shape == (4,)
    assert torch.equal(hidden, RecordingForward()(batch.input_ids, batch.positions, batch.meta, [])), "rows in order"
    assert torch.equal(call["input_ids"][:3], batch.input_ids) and torch.equal(call["positions"][:3], batch.positions)
    assert torch.equal(call["slot_mapping"][:3], batch.meta.slot_mapping)
    assert torch.equal(call["seq_lens"][:3], batch.meta.flat.seq_lens)
    assert torch.equal(call["block_tables"][:3, :4], batch.meta.flat.block_tables)
    assert call["block_tables"].shape == (4, MAX_BLOCKS) and call["max_query_len"] == 1
    assert torch.equal(call["query_start_loc"], torch.arange(5, dtype=torch.int32))
    # the padding row: no context (the kernel reads nothing, writes zeros), its K/V to the dummy slot
    assert call["input_ids"][3] == 0 and call["positions"][3] == 0
    assert call["seq_lens"][3] == 0 and call["slot_mapping"][3] == PADDING_SLOT


def test_buffers_are_reused_and_stale_rows_reset_across_batch_sizes():
    forward = RecordingForward()
    graphs = CudaGraphRunner(forward, [], 8, MAX_BLOCKS, PADDING_SLOT, torch.device("cpu"), capture=False)
    for num_seqs, seed in ((8, 2), (5, 3), (1, 4), (2, 5), (7, 6)):
        batch = decode_batch(num_seqs, 1 + seed % 4, seed)
        hidden = graphs.run(batch)
        call, size = forward.calls[-1], graphs.bucket_for(num_seqs)
        assert call["input_ids"].shape == (size,) and hidden.shape == (num_seqs, 2)
        assert torch.equal(hidden, RecordingForward()(batch.input_ids, batch.positions, batch.meta, []))
        # rows left over from a larger earlier step are padding again, not its sequences
        assert torch.all(call["seq_lens"][num_seqs:] == 0) and torch.all(call["input_ids"][num_seqs:] == 0)
        assert torch.all(call["slot_mapping"][num_seqs:] == PADDING_SLOT)
    assert len({call["pointers"] for call in forward.calls}) == 1     # every step, the same buffers
    assert graphs.num_runs == 5


@pytest.fixture(scope="module")
def triton_engine(tmp_path_factory):
    pytest.importorskip("transformers")
    pytest.importorskip("triton")
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and TRITON_INTERPRET is not 1")
    from engine import Engine
    from tests.support.random_decoders import save_random_decoder
    path = save_random_decoder(tmp_path_factory.mktemp("qwen3"), "qwen3")
    previous = os.environ.get("BARGE_ATTENTION_BACKEND")
    os.environ["BARGE_ATTENTION_BACKEND"] = "triton"
    try:
        return Engine.from_pretrained(path, mode="generate", device="cpu", dtype="float32",
                                      num_blocks=40, block_size=4, max_num_seqs=8)
    finally:
        os.environ.pop("BARGE_ATTENTION_BACKEND") if previous is None else os.environ.update(
            BARGE_ATTENTION_BACKEND=previous)


def test_a_decode_step_through_the_buffers_equals_the_eager_step(triton_engine):
    """Three decoding sequences (bucket 4): the same hidden states as the eager forward, and
    the same KV cache everywhere but the dummy block the padding row wrote to."""
    from engine import SamplingParams
    llm = triton_engine.llm
    runner = llm.runner
    for prompt in ([5, 6, 7, 8, 9], [10, 11], [12] * 9):
        llm.add_request(prompt, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    llm.step()                                       # the prompts
    output = llm.scheduler.schedule()                # three decodes
    assert all(count == 1 for count in output.num_scheduled_tokens.values()) and len(output.requests) == 3
    batch = runner.prepare(output)
    assert batch.is_decode_only
    num_real_blocks = llm.block_manager.num_blocks
    cache_before = [(k.clone(), v.clone()) for k, v, *_ in runner.kv_cache]
    with torch.inference_mode():
        eager = runner.model(batch.input_ids, batch.positions, batch.meta, runner.kv_cache)
        cache_eager = [(k[:, :num_real_blocks].clone(), v[:, :num_real_blocks].clone()) for k, v, *_ in runner.kv_cache]
        for (k, v, *_), (k0, v0) in zip(runner.kv_cache, cache_before):
            k.copy_(k0)
            v.copy_(v0)
        graphs = CudaGraphRunner(runner.model, runner.kv_cache, 8, 10, num_real_blocks * 4, runner.device, capture=False)
        through_buffers = graphs.run(batch)
    assert graphs.bucket_for(3) == 4
    # exact: the padding row changes no other row's arithmetic (seen bit-equal with oneDNN's fp32 matmuls)
    assert torch.equal(through_buffers, eager)
    for (k, v, *_), (k_eager, v_eager) in zip(runner.kv_cache, cache_eager):
        assert torch.equal(k[:, :num_real_blocks], k_eager) and torch.equal(v[:, :num_real_blocks], v_eager)
    assert not torch.equal(runner.kv_cache[0][0][:, num_real_blocks], cache_before[0][0][:, num_real_blocks])


def test_a_batch_beyond_the_largest_bucket_or_the_buffers_block_table_runs_eagerly():
    graphs = CudaGraphRunner(RecordingForward(), [], 8, MAX_BLOCKS, PADDING_SLOT, torch.device("cpu"), capture=False)
    assert graphs.can_run(decode_batch(8, MAX_BLOCKS, seed=7).meta.flat)
    assert not graphs.can_run(decode_batch(9, 2, seed=7).meta.flat)
    assert not graphs.can_run(decode_batch(2, MAX_BLOCKS + 1, seed=7).meta.flat)
