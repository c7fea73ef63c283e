"""Random PEFT LoRA adapters for the LoRA tests: made with peft on a transformers model and
saved with save_pretrained, as a user's trained adapter would be (no real adapter installs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]


def save_random_adapter(model, folder: Path, rank: int, targets: list[str], seed: int, scale: float,
                        use_rslora: bool = False) -> Path:
    """A LoRA adapter on `model` (a transformers model, left as it was) with lora_A at PEFT's
    default init and lora_B ~ N(0, scale^2), so that the adapter changes outputs (PEFT's own
    init leaves lora_B zero); lora_alpha 2r, so the scaling is 2 (2 sqrt(r) with rsLoRA)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, lora_dropout=0.0,
                        use_rslora=use_rslora, task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)
    peft_model.save_pretrained(folder)
    peft_model.unload()
    return folder


def peft_greedy_tokens(reference, adapter: Path, prompt: list[int], max_tokens: int) -> list[int]:
    """transformers' greedy tokens for `prompt` through PeftModel with `adapter` on `reference`
    (EOS ignored), which is left as it was."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(reference, adapter).eval()
    try:
        with torch.no_grad():
            output = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False,
                                    eos_token_id=None, pad_token_id=0)
        return output[0, len(prompt):].tolist()
    finally:
        model.unload()


def lora_client(tmp_path: Path, monkeypatch, max_rank: int) -> Iterator:
    """A fixture's body: a Client on a SQLite store in tmp_path that checks adapters against
    `max_rank` and knows only the built-in models (a user's BARGE_MODELS is unset)."""
    from jobs.client import Client
    from jobs.settings import Settings

    monkeypatch.delenv("BARGE_MODELS", raising=False)
    monkeypatch.delenv("BARGE_MODELS_FILE", raising=False)
    client = Client(settings=Settings.from_env({"BARGE_DATA_DIR": str(tmp_path / "barge"),
                                                "BARGE_MAX_LORA_RANK": str(max_rank)}))
    yield client
    client.store.engine.dispose()
