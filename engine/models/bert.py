"""BERT-style encoder (BERT, RoBERTa, XLM-R): token ids -> last hidden states."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import EncoderConfig

ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}

# Checkpoint name pieces -> ours, applied in order ("attention.output.dense" must go
# before "output.dense"). Names outside the encoder (pooler, MLM head) are dropped.
CHECKPOINT_PREFIXES = ("bert.", "roberta.")
CHECKPOINT_RENAMES = (
    ("encoder.layer.", "layers."),
    ("attention.self.", "attention."),
    ("attention.output.dense", "attention.out"),
    ("attention.output.LayerNorm", "attention_norm"),
    ("intermediate.dense", "ffn_in"),
    ("output.dense", "ffn_out"),
    ("output.LayerNorm", "ffn_norm"),
    ("embeddings.LayerNorm", "embeddings.norm"),
)


def checkpoint_name_to_ours(name: str) -> str | None:
    for prefix in CHECKPOINT_PREFIXES:
        name = name.removeprefix(prefix)
    if not name.startswith(("embeddings.", "encoder.")) or name == "embeddings.position_ids":
        return None
    for old, new in CHECKPOINT_RENAMES:
        name = name.replace(old, new)
    return name


class BertEmbeddings(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.position_offset = config.position_offset

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # input_ids: [batch, seq]. Texts are right-padded, so every text's positions
        # start at 0; padded slots get positions too but are masked everywhere.
        seq_len = input_ids.shape[1]
        positions = torch.arange(seq_len, device=input_ids.device) + self.position_offset
        hidden = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        # Single-text inputs: every token is segment 0.
        hidden = hidden + self.token_type_embeddings.weight[0]
        return self.norm(hidden)


class SelfAttention(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_heads
        self.head_dim = hidden // config.num_heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, hidden: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        # hidden: [batch, seq, hidden]; key_mask: [batch, 1, 1, seq], True = real token.
        batch, seq_len, _ = hidden.shape
        q, k, v = (proj(hidden).view(batch, seq_len, self.num_heads, self.head_dim).transpose(1, 2)
                   for proj in (self.query, self.key, self.value))
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
        return self.out(attended.transpose(1, 2).reshape(batch, seq_len, -1))


class BertLayer(nn.Module):
    """Post-norm transformer block: x = norm(x + attn(x)); x = norm(x + ffn(x))."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.attention = SelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ffn_in = nn.Linear(config.hidden_size, config.intermediate_size)
        self.ffn_out = nn.Linear(config.intermediate_size, config.hidden_size)
        self.ffn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        if config.hidden_act not in ACTIVATIONS:
            raise ValueError(f"unsupported hidden_act {config.hidden_act!r}; expected one of {sorted(ACTIVATIONS)}")
        self.act = ACTIVATIONS[config.hidden_act]

    def forward(self, hidden: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.attention_norm(hidden + self.attention(hidden, key_mask))
        return self.ffn_norm(hidden + self.ffn_out(self.act(self.ffn_in(hidden))))


class BertModel(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.embeddings = BertEmbeddings(config)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids, attention_mask: [batch, seq] -> last hidden states [batch, seq, hidden]."""
        key_mask = attention_mask.bool()[:, None, None, :]
        hidden = self.embeddings(input_ids)
        for layer in self.layers:
            hidden = layer(hidden, key_mask)
        return hidden
