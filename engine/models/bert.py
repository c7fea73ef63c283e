"""BERT-style encoder (BERT, RoBERTa, XLM-R) over packed batches: token ids -> hidden states.

Every tensor is [num_tokens, ...] with the batch's texts laid end to end (see
engine/embed/batching.py): no padding, no mask. Q, K and V are one fused projection.

NOTE: two paths through the model, one result. On CPU the layers are the PyTorch ops
below, with oneDNN's GELU and residual-add post-ops (engine/layers/linear.py); their
results and speed are what the parity tests pin. On CUDA (or with `fused_ops=True`) the
small ops between the matmuls run as one Triton kernel each
(engine/kernels/fused_encoder_ops.py): the embeddings' three gathers, sums and norm; each
linear's bias with GELU after it, or with the residual add and LayerNorm after it. A layer
is then about 8 launches (4 matmuls, attention, GELU, 2 norms) instead of about 10, and
the embeddings 1 instead of about 6, with one pass over each activation between matmuls.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

from engine.embed.batching import PackedBatch
from engine.layers.attention import attend_one_row_per_text, varlen_attention
from engine.layers.linear import ACTIVATIONS, GELU_APPROXIMATE, linear_act, linear_residual, linear_unbiased

# model_type -> whether position ids are offset: RoBERTa-style models number positions
# from pad_token_id + 1, so position 0 of the text is embedding row pad_token_id + 1.
MODEL_TYPES = {"bert": False, "roberta": True, "xlm-roberta": True}


@dataclass(frozen=True)
class BertConfig:
    """The architecture of a BERT / RoBERTa / XLM-R encoder, from its config.json."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    hidden_act: str             # "gelu" | "gelu_new" | "gelu_pytorch_tanh" | "relu"
    layer_norm_eps: float
    max_position_embeddings: int
    type_vocab_size: int
    pad_token_id: int
    position_offset: int        # 0 for BERT, pad_token_id + 1 for RoBERTa

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads {self.num_heads}")

    @property
    def max_positions(self) -> int:
        """Tokens per text the position table covers."""
        return self.max_position_embeddings - self.position_offset


def bert_config_from_hf(hf: dict) -> BertConfig:
    pad_token_id = hf.get("pad_token_id", 0) or 0
    return BertConfig(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], intermediate_size=hf["intermediate_size"],
        hidden_act=hf.get("hidden_act", "gelu"), layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        max_position_embeddings=hf["max_position_embeddings"], type_vocab_size=hf.get("type_vocab_size", 2),
        pad_token_id=pad_token_id, position_offset=pad_token_id + 1 if MODEL_TYPES[hf["model_type"]] else 0,
    )


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
# weight_scale: an FP8 weight's row-form scale (engine/quant/fp8.py) fuses by the same concatenation.
QKV_PIECE = re.compile(r"^(layers\.\d+\.attention)\.(query|key|value)\.(weight|bias|weight_scale)$")


def checkpoint_name_to_ours(name: str) -> str | None:
    for prefix in CHECKPOINT_PREFIXES:
        name = name.removeprefix(prefix)
    if not name.startswith(("embeddings.", "encoder.")) or name == "embeddings.position_ids":
        return None
    for old, new in CHECKPOINT_RENAMES:
        name = name.replace(old, new)
    return name


def fuse_qkv(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Concatenate each layer's query, key and value (weights and biases) into `qkv`."""
    fused: dict[str, torch.Tensor] = {}
    pieces: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in state.items():
        match = QKV_PIECE.match(name)
        if match is None:
            fused[name] = tensor
        else:
            prefix, which, kind = match.groups()
            pieces.setdefault(f"{prefix}.qkv.{kind}", {})[which] = tensor
    for name, parts in pieces.items():
        if set(parts) != {"query", "key", "value"}:
            raise ValueError(f"checkpoint has only {sorted(parts)} of query/key/value for {name}")
        fused[name] = torch.cat([parts["query"], parts["key"], parts["value"]])
    return fused


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.position_offset = config.position_offset

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        # input_ids, positions, token_type_ids: [num_tokens] -> [num_tokens, hidden]
        hidden = self.word_embeddings(input_ids) + self.position_embeddings(positions + self.position_offset)
        # Single texts: every token is segment 0. A cross-encoder's pair: the second text is segment 1.
        if token_type_ids is None:
            return self.norm(hidden + self.token_type_embeddings.weight[0])
        return self.norm(hidden + self.token_type_embeddings(token_type_ids))

    def fused(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """As forward, in one kernel."""
        from engine.kernels import fused_encoder_ops    # triton is imported only where it is used
        return fused_encoder_ops.embedding_layer_norm(
            input_ids, self.word_embeddings.weight, self.norm.weight, self.norm.bias, self.norm.eps,
            positions=positions, position_table=self.position_embeddings.weight,
            position_offset=self.position_offset, row=self.token_type_embeddings.weight[0])


class SelfAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.out = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        """hidden: [num_tokens, hidden] -> hidden + attention(hidden), before the norm."""
        return linear_residual(self.attend(hidden, batch), self.out, hidden)

    def attend(self, hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        """hidden: [num_tokens, hidden] -> the heads' outputs [num_tokens, hidden], before `out`."""
        return varlen_attention(self.qkv(hidden), batch.groups, self.num_heads, batch.cu_seqlens)

    def attend_rows(self, hidden: torch.Tensor, batch: PackedBatch, rows: torch.Tensor) -> torch.Tensor:
        """The heads' outputs [num_seqs, hidden] of one token per text (rows: their flat
        indices, text by text), each attending over its whole text. Q, K and V come from the
        one fused linear over every token (a packed or FP8 weight cannot be sliced); only
        the attention is cut to the rows."""
        return attend_one_row_per_text(self.qkv(hidden), batch.groups, self.num_heads, rows)


class BertLayer(nn.Module):
    """Post-norm transformer block: x = norm(x + attn(x)); x = norm(x + ffn(x))."""

    def __init__(self, config: BertConfig):
        super().__init__()
        if config.hidden_act not in ACTIVATIONS:
            raise ValueError(f"unsupported hidden_act {config.hidden_act!r}; expected one of {sorted(ACTIVATIONS)}")
        self.attention = SelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ffn_in = nn.Linear(config.hidden_size, config.intermediate_size)
        self.ffn_out = nn.Linear(config.intermediate_size, config.hidden_size)
        self.ffn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.act = config.hidden_act

    def forward(self, hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        return self._after_attention(self.attention(hidden, batch))

    def forward_rows(self, hidden: torch.Tensor, batch: PackedBatch, rows: torch.Tensor) -> torch.Tensor:
        """As forward, for the tokens `rows` alone (one per text): [num_seqs, hidden]. Past
        the attention a token's states depend on no other token, so a head that pools one
        token per text needs the last layer's output projection, norms and FFN only there."""
        attended = self.attention.attend_rows(hidden, batch, rows)
        return self._after_attention(linear_residual(attended, self.attention.out, hidden[rows]))

    def _after_attention(self, with_attention: torch.Tensor) -> torch.Tensor:
        """The residual stream plus the attention's output -> the norm, then the FFN block."""
        hidden = self.attention_norm(with_attention)
        inner = linear_act(hidden, self.ffn_in, self.act)
        return self.ffn_norm(linear_residual(inner, self.ffn_out, hidden))

    def forward_fused(self, hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        """As forward: each norm takes its linear's product, that linear's bias and the
        residual in one kernel; GELU takes its linear's product and bias in another."""
        from engine.kernels import fused_encoder_ops as ops
        product, bias = linear_unbiased(self.attention.attend(hidden, batch), self.attention.out)
        norm = self.attention_norm
        hidden = ops.layer_norm(product, norm.weight, norm.bias, norm.eps, residual=hidden, x_bias=bias)
        if self.act in GELU_APPROXIMATE:
            product, bias = linear_unbiased(hidden, self.ffn_in)
            inner = ops.bias_gelu_(product, bias, GELU_APPROXIMATE[self.act])
        else:
            inner = linear_act(hidden, self.ffn_in, self.act)
        product, bias = linear_unbiased(inner, self.ffn_out)
        norm = self.ffn_norm
        return ops.layer_norm(product, norm.weight, norm.bias, norm.eps, residual=hidden, x_bias=bias)


class BertModel(nn.Module):
    runs_rows = True    # forward takes rows=: a head pooling one token per text runs the last layer for it alone

    def __init__(self, config: BertConfig):
        super().__init__()
        self.embeddings = BertEmbeddings(config)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_layers))
        self.fused_ops: bool | None = None      # the Triton path; None: on CUDA only

    def forward(self, batch: PackedBatch, token_type_ids: torch.Tensor | None = None,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """A packed batch (on this model's device) -> last hidden states [num_tokens, hidden].
        token_type_ids [num_tokens]: each token's segment (a pair's); None: all segment 0.
        rows [num_seqs]: one token per text, text by text (the one a classifier's head
        pools): the last layer runs for them alone and the result is [num_seqs, hidden]."""
        fused = self.fused_ops or (self.fused_ops is None and batch.input_ids.is_cuda)
        if fused:   # the fused embedding kernel adds segment 0's row to every token: pairs take the PyTorch ops
            hidden = (self.embeddings.fused(batch.input_ids, batch.positions) if token_type_ids is None
                      else self.embeddings(batch.input_ids, batch.positions, token_type_ids))
        else:
            hidden = self.embeddings(batch.input_ids, batch.positions, token_type_ids)
        layers = self.layers if rows is None else self.layers[:-1]
        for layer in layers:
            hidden = layer.forward_fused(hidden, batch) if fused else layer(hidden, batch)
        return hidden if rows is None else self.layers[-1].forward_rows(hidden, batch, rows)
