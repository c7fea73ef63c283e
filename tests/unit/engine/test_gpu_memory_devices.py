"""GPU memory sizing (engine.gpu_memory) as pure arithmetic: a share of the device for
weights, activations and the KV cache, and a model that does not fit refused with its
sizes. The figures use Llama-3-8B's shapes on an H100 (80 GiB) and an H200 (140 GiB)."""

from types import SimpleNamespace

import pytest
import torch

from engine.generate.options import GenerateOptions
from engine.gpu_memory import (ACTIVATION_SAFETY, GIB, ModelDoesNotFit, activation_bytes, kv_cache_blocks,
                               plan_kv_cache)

LLAMA_8B_BLOCK = 2 * 32 * 16 * 8 * 128 * 2       # K and V, 32 layers, 16 tokens, 8 KV heads of 128, bf16: 2 MiB
LLAMA_8B_WEIGHTS = int(14.96 * GIB)              # 8.03e9 parameters in bf16


def test_the_activation_estimate_counts_the_widest_layer_and_the_logits():
    per_token = (2 * 14336 + 4 * 4096) * 2
    logits = 128 * 128256 * 4
    assert activation_bytes(4096, 14336, 128256, 2048, 128, 2) == int(ACTIVATION_SAFETY * (2048 * per_token + logits))


def test_the_kv_cache_gets_what_weights_and_activations_leave_of_the_share():
    activations = activation_bytes(4096, 14336, 128256, 2048, 128, 2)
    plan = plan_kv_cache(80 * GIB, 0.9, LLAMA_8B_WEIGHTS, activations, LLAMA_8B_BLOCK, 16, 2048)
    assert plan.budget_bytes == int(80 * GIB * 0.9)
    assert plan.kv_bytes == plan.budget_bytes - LLAMA_8B_WEIGHTS - activations
    assert plan.num_blocks == plan.kv_bytes // LLAMA_8B_BLOCK
    assert plan.max_concurrent_tokens == plan.num_blocks * 16
    assert 28_900 < plan.num_blocks < 29_000          # 56.6 GiB of KV: 463k tokens at once
    text = plan.describe()
    assert "weights 14.96 GiB" in text and f"{plan.num_blocks} blocks of 16 tokens" in text


def test_two_engines_on_one_gpu_at_045_each_stay_within_it():
    activations = activation_bytes(4096, 14336, 128256, 2048, 128, 2)
    plans = [plan_kv_cache(140 * GIB, 0.45, LLAMA_8B_WEIGHTS, activations, LLAMA_8B_BLOCK, 16, 2048)
             for _ in range(2)]
    used = sum(p.weights_bytes + p.activation_bytes + p.num_blocks * LLAMA_8B_BLOCK for p in plans)
    assert used <= 0.9 * 140 * GIB


def test_a_model_that_does_not_fit_is_refused_with_its_sizes():
    with pytest.raises(ModelDoesNotFit, match=r"weights 70\.00 GiB.*BARGE_GPU_MEMORY_FRACTION"):
        plan_kv_cache(80 * GIB, 0.45, 70 * GIB, GIB, LLAMA_8B_BLOCK, 16, 2048)
    with pytest.raises(ValueError, match="gpu_memory_fraction"):
        plan_kv_cache(80 * GIB, 1.5, GIB, GIB, LLAMA_8B_BLOCK, 16, 2048)


def test_the_fraction_is_validated_and_none_keeps_the_older_kv_share():
    assert GenerateOptions().gpu_memory_fraction == 0.9
    with pytest.raises(ValueError, match="gpu_memory_fraction"):
        GenerateOptions(gpu_memory_fraction=0.0)
    config = SimpleNamespace(num_layers=2, num_kv_heads=2, head_dim=16)
    options = GenerateOptions(max_num_seqs=4, kv_cache_memory_fraction=0.01, gpu_memory_fraction=None)
    # On CPU, or with gpu_memory_fraction None, the KV cache is a share of free memory, capped at
    # what max_num_seqs requests of max_model_len tokens could use.
    assert kv_cache_blocks(None, config, options, torch.float32, torch.device("cpu"), 64) == 4 * 64 // 16
