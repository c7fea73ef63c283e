"""FP8 checkpoints of a random Qwen3 (transformers, fixed seed, save_pretrained): written by
`barge quantize` in both formats, read back to exactly the model quantizing at load gives,
and the on-disk scales read with Hugging Face's convention (weight = q * weight_scale_inv)."""

import json
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

from engine import Engine, SamplingParams  # noqa: E402
from engine.layers.fp8_linear import Fp8Linear  # noqa: E402
from cli.main import main  # noqa: E402
from tests.support.random_decoders import save_random_decoder  # noqa: E402

ENGINE_OPTIONS = dict(num_blocks=64, block_size=4, max_num_batched_tokens=32)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    # hidden 64, head_dim 32: q rows 128, k and v rows 64 each — fused Q/K/V blocks do not
    # line up with a 128-row grid, the case row-form scales exist for.
    return save_random_decoder(tmp_path_factory.mktemp("qwen3"), "qwen3")


def _prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(3, 500, (length,), generator=generator).tolist() for length in (5, 23, 40)]


def _run(engine: Engine) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy tokens for every prompt, and the prompt log-probabilities of the longest."""
    outputs = engine.generate(_prompts(), SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))
    prompt = _prompts()[-1]
    scored = engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0))[0]
    logprobs = torch.tensor([entry[token] for entry, token in zip(scored.prompt_logprobs[1:], prompt[1:])])
    return [output.token_ids for output in outputs], logprobs


def _tensors(folder) -> dict[str, torch.Tensor]:
    with safe_open(str(folder / "model.safetensors"), framework="pt") as checkpoint:
        return {name: checkpoint.get_tensor(name) for name in checkpoint.keys()}


@pytest.mark.parametrize("scheme", ["fp8-block", "fp8"])
def test_written_checkpoint_runs_exactly_like_quantizing_at_load(qwen3, tmp_path, scheme, capsys):
    destination = tmp_path / "qwen3-fp8"
    assert main(["quantize", str(qwen3), str(destination), "--scheme", scheme]) == 0
    assert "14 linear weights in FP8" in capsys.readouterr().out       # 2 layers x q, k, v, o, gate, up, down
    from_checkpoint = Engine.from_pretrained(destination, mode="generate", **ENGINE_OPTIONS)
    at_load = Engine.from_pretrained(qwen3, mode="generate", quantization=scheme, **ENGINE_OPTIONS)
    layers = [m for m in from_checkpoint.llm.runner.model.modules() if isinstance(m, Fp8Linear)]
    assert len(layers) == 2 * 4
    tokens, logprobs = _run(from_checkpoint)
    expected_tokens, expected_logprobs = _run(at_load)
    assert tokens == expected_tokens
    assert torch.equal(logprobs, expected_logprobs)


def test_block_checkpoint_has_the_layout_qwen3_fp8_ships(qwen3, tmp_path):
    destination = tmp_path / "qwen3-fp8-block"
    assert main(["quantize", str(qwen3), str(destination), "--scheme", "fp8-block"]) == 0
    config = json.loads((destination / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "fp8" and config["weight_block_size"] == [128, 128]
    assert config["activation_scheme"] == "dynamic" and config["fmt"] == "e4m3"
    tensors = _tensors(destination)
    assert tensors["model.layers.0.self_attn.k_proj.weight"].dtype == torch.float8_e4m3fn
    assert tensors["model.layers.0.self_attn.k_proj.weight_scale_inv"].shape == (1, 1)    # [64, 64] weight
    assert tensors["model.layers.0.mlp.down_proj.weight_scale_inv"].shape == (1, 1)
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.layers.0.self_attn.q_norm.weight"):
        assert tensors[name].dtype == torch.float32
    assert (destination / "tokenizer.json").is_file()
    assert main(["quantize", str(destination), str(tmp_path / "again")]) == 2      # already quantized


def test_compressed_tensors_checkpoint_has_per_channel_scales(qwen3, tmp_path):
    destination = tmp_path / "qwen3-ct"
    assert main(["quantize", str(qwen3), str(destination)]) == 0
    config = json.loads((destination / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors" and config["format"] == "float-quantized"
    group = config["config_groups"]["group_0"]
    assert group["weights"]["strategy"] == "channel" and group["input_activations"]["strategy"] == "token"
    assert _tensors(destination)["model.layers.1.mlp.gate_proj.weight_scale"].shape == (128, 1)


def test_scale_inv_is_read_as_the_multiplier_that_dequantizes(qwen3, tmp_path):
    """Independent of our reader: dequantize the block checkpoint here by HF's convention, save
    it as a plain fp32 model, and the FP8 checkpoint must score like it (CPU dequantizes exactly)."""
    quantized = tmp_path / "fp8"
    assert main(["quantize", str(qwen3), str(quantized), "--scheme", "fp8-block"]) == 0
    tensors, plain = _tensors(quantized), tmp_path / "dequantized"
    dequantized = {}
    for name, tensor in tensors.items():
        if name.endswith(".weight_scale_inv"):
            continue
        if tensor.dtype == torch.float8_e4m3fn:
            scale = tensors[name + "_scale_inv"].repeat_interleave(128, 0).repeat_interleave(128, 1)
            tensor = tensor.float() * scale[:tensor.shape[0], :tensor.shape[1]]
        dequantized[name] = tensor
    plain.mkdir()
    save_file(dequantized, str(plain / "model.safetensors"))
    config = json.loads((quantized / "config.json").read_text())
    del config["quantization_config"]
    (plain / "config.json").write_text(json.dumps(config))
    for extra in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (quantized / extra).is_file():
            (plain / extra).write_bytes((quantized / extra).read_bytes())
    _, fp8_logprobs = _run(Engine.from_pretrained(quantized, mode="generate", **ENGINE_OPTIONS))
    _, plain_logprobs = _run(Engine.from_pretrained(plain, mode="generate", **ENGINE_OPTIONS))
    torch.testing.assert_close(fp8_logprobs, plain_logprobs, atol=1e-5, rtol=1e-5)


def test_eval_quant_command_reports_perplexity_and_agreement(qwen3, capsys):
    assert main(["eval-quant", str(qwen3), "--samples", "40", "--num-tokens", "128"]) == 0
    out = capsys.readouterr().out
    assert "generate model, fp8 vs float32, 4 samples" in out
    assert "perplexity over 128 tokens" in out and "greedy agreement" in out
    # A decoder folder embeds too (last-token pooling): the embed comparison runs on it.
    assert main(["eval-quant", str(qwen3), "--mode", "embed", "--samples", "40"]) == 0
    assert "embed model, fp8 vs float32, 40 samples" in capsys.readouterr().out
    assert main(["eval-quant", str(qwen3.parent / "no-such-model")]) == 2
