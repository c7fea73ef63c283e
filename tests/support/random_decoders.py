"""Small random-weight decoders (Llama, Qwen2, Qwen3, Mistral) saved with save_pretrained,
plus a byte-level BPE tokenizer trained here, so no test needs a model hub."""

from __future__ import annotations

import json
from pathlib import Path

import torch

VOCAB_SIZE = 512
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SMALL = dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
             bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
             # Wide init: random logits then have clear winners, so greedy parity is not
             # decided by float rounding between two near-equal tokens.
             initializer_range=0.25)
FAMILIES = {
    "llama": dict(rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "qwen2": dict(tie_word_embeddings=True),
    "qwen3": dict(head_dim=32),
    "mistral": dict(sliding_window=None),
}


def save_random_decoder(folder: Path, family: str, seed: int = 0, **overrides) -> Path:
    import transformers

    config_class = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                    "qwen3": transformers.Qwen3Config, "mistral": transformers.MistralConfig}[family]
    config = config_class(**{**SMALL, **FAMILIES[family], **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    model.save_pretrained(folder)
    save_tokenizer(folder)
    return folder


def save_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = Path("/usr/share/common-licenses/GPL-3").read_text().splitlines()
    tokenizer.train_from_iterator(text, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHAT_TEMPLATE}))
