"""The Triton attention path through the whole engine (BARGE_ATTENTION_BACKEND=triton, run
by Triton's interpreter on CPU): a random Llama gives the same greedy tokens in fp32 as
the CPU path (compiled decode kernel, SDPA prefill), through chunked prefill and a
prefix-cache hit, eagerly and through the decode-graph runner's static buffers (capture
is off on CPU). Tiny model and few steps: the interpreter is slow."""

import os

import pytest
import torch

pytest.importorskip("triton")
pytest.importorskip("transformers")

from engine.generate.cuda_graph import CudaGraphRunner  # noqa: E402

BLOCK_SIZE = 4
OPTIONS = dict(num_blocks=96, block_size=BLOCK_SIZE, max_num_batched_tokens=24, max_num_seqs=8)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and TRITON_INTERPRET is not 1")
    from tests.support.random_decoders import save_random_decoder
    return save_random_decoder(tmp_path_factory.mktemp("llama"), "llama")


def load(path, backend, monkeypatch):
    from engine import Engine
    monkeypatch.setenv("BARGE_ATTENTION_BACKEND", backend)
    return Engine.from_pretrained(path, mode="generate", device="cpu", dtype="float32", **OPTIONS)


def run(engine):
    """Two rounds: the second repeats the first round's long prompt with a new ending, so its
    first 8 blocks come from the prefix cache and the rest is a chunk after cached tokens."""
    from engine import SamplingParams
    generator = torch.Generator().manual_seed(4)
    shared = torch.randint(3, 500, (33,), generator=generator).tolist()
    first = [shared, [7], torch.randint(3, 500, (9,), generator=generator).tolist()]
    second = [shared[:32] + [11, 12, 13, 14, 15], [9, 8]]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    tokens = [out.token_ids for out in engine.generate(first, params)]
    outputs = engine.generate(second, params)
    return tokens + [out.token_ids for out in outputs], outputs[0].num_cached_tokens


def test_the_triton_path_gives_the_cpu_path_greedy_tokens(llama, monkeypatch):
    native = load(llama, "native", monkeypatch)
    assert native.llm.runner.use_cpu_kernel and not native.llm.runner.use_triton
    expected, expected_cached = run(native)

    triton_engine = load(llama, "triton", monkeypatch)
    runner = triton_engine.llm.runner
    assert runner.use_triton and not runner.use_cpu_kernel and runner.graphs is None   # no graphs on CPU
    # one dummy block past the block manager's for padding rows of a graph bucket
    assert runner.kv_cache[0][0].shape[1] == triton_engine.llm.block_manager.num_blocks + 1
    tokens, cached = run(triton_engine)
    assert cached == expected_cached == 32
    assert tokens == expected


def test_decode_steps_through_the_graph_buffers_give_the_same_tokens(llama, monkeypatch):
    """The graph runner with capture off: every decode-only step copies into its static
    buffers (batch sizes 3, 2 and 1 here, padded to buckets 4, 2, 1) and runs the forward there."""
    native, _ = run(load(llama, "native", monkeypatch))
    engine = load(llama, "triton", monkeypatch)
    llm = engine.llm
    padding_slot = llm.block_manager.num_blocks * BLOCK_SIZE
    llm.runner.graphs = CudaGraphRunner(llm.runner.model, llm.runner.kv_cache, OPTIONS["max_num_seqs"],
                                        llm.max_model_len // BLOCK_SIZE, padding_slot, llm.runner.device,
                                        capture=False)
    tokens, _ = run(engine)
    assert llm.runner.graphs.num_runs > 0
    assert tokens == native


@pytest.mark.parametrize("value, device, backend", [
    (None, "cpu", "native"), ("auto", "cpu", "native"), ("", "cpu", "native"), ("triton", "cpu", "triton"),
    (" Triton ", "cpu", "triton"), (None, "cuda", "triton"), ("native", "cuda", "native")])
def test_the_attention_backend_is_triton_on_cuda_and_native_elsewhere_unless_named(value, device, backend,
                                                                                   monkeypatch):
    from engine.generate.attention import attention_backend
    if value is None:
        monkeypatch.delenv("BARGE_ATTENTION_BACKEND", raising=False)
    else:
        monkeypatch.setenv("BARGE_ATTENTION_BACKEND", value)
    assert attention_backend(torch.device(device)) == backend


def test_an_unknown_attention_backend_is_refused_naming_it(monkeypatch):
    from engine.generate.attention import attention_backend
    monkeypatch.setenv("BARGE_ATTENTION_BACKEND", "flash")
    with pytest.raises(ValueError, match="BARGE_ATTENTION_BACKEND.*'flash'"):
        attention_backend(torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host syncs are a CUDA matter")
def test_a_decode_step_on_cuda_syncs_only_to_read_the_sampled_ids(llama, monkeypatch):
    """The forward (graph replay, and eager under enforce_eager) and the LM head run with
    CUDA's sync debug mode set to raise: no .item(), .tolist() or blocking copy inside."""
    from engine import Engine, SamplingParams
    monkeypatch.delenv("BARGE_ATTENTION_BACKEND", raising=False)
    for enforce_eager in (False, True):
        engine = Engine.from_pretrained(llama, mode="generate", device="cuda", dtype="float32",
                                        enforce_eager=enforce_eager, **OPTIONS)
        llm, runner = engine.llm, engine.llm.runner
        assert (runner.graphs is not None) == (not enforce_eager)
        assert engine.settings["cuda_graphs"] == (not enforce_eager)
        for prompt in ([5, 6, 7], [8, 9, 10, 11, 12]):
            llm.add_request(prompt, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        llm.step()
        batch = runner.prepare(llm.scheduler.schedule())
        assert batch.is_decode_only
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            with torch.inference_mode():
                if runner.graphs is not None:
                    hidden = runner.graphs.run(batch)
                else:
                    hidden = runner.model(batch.input_ids, batch.positions, batch.meta, runner.kv_cache)
                runner.model.compute_logits(hidden[batch.logit_rows])
        finally:
            torch.cuda.set_sync_debug_mode("default")
