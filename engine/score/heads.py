"""Sequence classifiers over packed batches: Barge's own encoders and decoder
(engine/models/) with the head a *ForSequenceClassification checkpoint carries.

    family       pooled token(s)                 head                                   checkpoint names
    bert         each text's first ([CLS])       pooler: dense, tanh; classifier         bert.pooler.dense, classifier
    (roberta)                                    (the same math)                        classifier.dense, classifier.out_proj
    modernbert   first, or mean (classifier_     head: dense, act, norm; classifier      head.dense, head.norm, classifier
                 pooling)
    decoder      last token that is not pad      score (no bias)                        score

Every classifier maps (PackedBatch, token_type_ids) to logits [num_seqs, num_labels] in
float32. The encoder's tensors load through its embed family (engine/models/families.py):
renamed, fused, under `encoder.`; the head's are renamed here (head_name_to_ours).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.embed.batching import PackedBatch
from engine.layers.linear import ACTIVATIONS
from engine.layers.pooling import first_rows, pool
from engine.models.bert import BertConfig, BertModel
from engine.models.llama import LlamaForEmbedding
from engine.models.modernbert import ModernBertConfig, ModernBertModel
from engine.generate.model_config import DecoderConfig
from engine.score.head_config import HeadConfig

# family -> (checkpoint prefix, ours) for the head's tensors, the first match wins.
HEAD_PREFIXES = {
    "bert": (("bert.pooler.dense.", "pooler."), ("classifier.dense.", "pooler."),        # BERT, RoBERTa / XLM-R
             ("classifier.out_proj.", "classifier."), ("classifier.", "classifier.")),
    "modernbert": (("head.dense.", "head.dense."), ("head.norm.", "head.norm."), ("classifier.", "classifier.")),
    "decoder": (("score.", "score."),),
}


def head_name_to_ours(family: str, name: str) -> str | None:
    """The head tensor a checkpoint name is, under our name; None for any other tensor."""
    for prefix, ours in HEAD_PREFIXES[family]:
        if name.startswith(prefix):
            return ours + name.removeprefix(prefix)
    return None


def last_kept_rows(input_ids: torch.Tensor, seq_lens: torch.Tensor, pad_token_id: int | None) -> torch.Tensor:
    """[num_seqs] the flat index of each text's last token that is not `pad_token_id` (its
    first token when all are), as transformers pools a decoder classifier; with no pad
    token, its last token."""
    ends = torch.cumsum(seq_lens, 0)
    if pad_token_id is None:
        return ends - 1
    index = torch.arange(input_ids.shape[0], device=input_ids.device)
    kept = torch.where(input_ids != pad_token_id, index, torch.full_like(index, -1))
    text_of = torch.repeat_interleave(torch.arange(seq_lens.shape[0], device=seq_lens.device), seq_lens)
    last = torch.full_like(seq_lens, -1).scatter_reduce(0, text_of, kept, "amax")
    return torch.where(last >= 0, last, ends - seq_lens)


class BertClassifier(nn.Module):
    """BertForSequenceClassification, and RobertaForSequenceClassification's head (the same
    dense-tanh-linear on the first token)."""

    def __init__(self, config: BertConfig, head: HeadConfig):
        super().__init__()
        self.encoder = BertModel(config)
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
        self.classifier = nn.Linear(config.hidden_size, head.num_labels)

    def forward(self, batch: PackedBatch, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        first = self.encoder(batch, token_type_ids, rows=first_rows(batch.seq_lens))   # [num_seqs, hidden]
        return self.classifier(torch.tanh(self.pooler(first))).float()


class ModernBertHead(nn.Module):
    def __init__(self, config: ModernBertConfig, head: HeadConfig):
        super().__init__()
        if head.classifier_activation not in ACTIVATIONS:
            raise ValueError(f"unsupported classifier_activation {head.classifier_activation!r}; "
                             f"expected one of {sorted(ACTIVATIONS)}")
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=head.classifier_bias)
        self.act = ACTIVATIONS[head.classifier_activation]
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(pooled)))


class ModernBertClassifier(nn.Module):
    """ModernBertForSequenceClassification: its pooling (cls or mean), head and classifier."""

    def __init__(self, config: ModernBertConfig, head: HeadConfig):
        super().__init__()
        self.encoder = ModernBertModel(config)
        self.head = ModernBertHead(config, head)
        self.classifier = nn.Linear(config.hidden_size, head.num_labels)
        self.pooling = head.pooling

    def forward(self, batch: PackedBatch, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.encoder(batch)         # ModernBERT has no segments
        if self.pooling == "cls":
            pooled = hidden[first_rows(batch.seq_lens)]
        else:
            pooled = pool(hidden, batch.seq_lens, "mean").to(hidden.dtype)
        return self.classifier(self.head(pooled)).float()


class DecoderClassifier(nn.Module):
    """LlamaForSequenceClassification and its Mistral / Qwen2 / Qwen3 twins: causal
    attention within each text, `score` on the last token that is not padding."""

    def __init__(self, config: DecoderConfig, head: HeadConfig):
        super().__init__()
        self.encoder = LlamaForEmbedding(config)
        self.score = nn.Linear(config.hidden_size, head.num_labels, bias=False)
        self.pad_token_id = head.pad_token_id

    def forward(self, batch: PackedBatch, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.encoder(batch)
        return self.score(hidden[last_kept_rows(batch.input_ids, batch.seq_lens, self.pad_token_id)]).float()


CLASSIFIERS = {"bert": BertClassifier, "modernbert": ModernBertClassifier, "decoder": DecoderClassifier}
