"""Scoring: classify rows, score (query, document) pairs, rank the best per group.

    params.py          ClassifyParams, ScoreParams: what a caller chooses per call (torch-free)
    outputs.py         ClassifyResult, ScoreOutput: one per row (torch-free)
    rows.py            what a row must be; a bad one is its row's error (torch-free)
    head_config.py     HeadConfig, score_method: what config.json says about scoring a model (torch-free)
    labels.py          logits -> labels and scores (torch-free)
    top_n.py           top_n: the best N rows of each group (torch-free)
    heads.py           the classifiers: Barge's encoders and decoder with a classification head
    loader.py          load_classifier: a *ForSequenceClassification folder, ready
    tokenizer.py       ScoreTokenizer: texts, pairs and chats -> token ids
    classifier.py      Classifier: classify rows; score pairs as a cross-encoder
    rerank_prompt.py   the yes/no reranker's prompt, Qwen3-Reranker's (torch-free)
    query_groups.py    plan_rounds: a rerank's pairs grouped by query for the prefix cache (torch-free)
    reranker.py        YesNoReranker: P(yes) of each pair through the generate engine
    bi_encoder.py      BiEncoder: the cosine of two embeddings through the embedder
    pairs.py           PairScorer: whichever of the three a model folder calls for

The names below load on first use (PEP 562): the worker and the client build the params
(torch-free) without loading the model code and torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.lazy import lazy_names

_WHERE = {"ClassifyParams": "engine.score.params", "ScoreParams": "engine.score.params",
          "ClassifyResult": "engine.score.outputs", "ScoreOutput": "engine.score.outputs",
          "score_method": "engine.score.head_config", "top_n": "engine.score.top_n",
          "Classifier": "engine.score.classifier", "PairScorer": "engine.score.pairs"}

__all__ = ["ClassifyParams", "ClassifyResult", "Classifier", "PairScorer", "ScoreOutput", "ScoreParams",
           "score_method", "top_n"]

if TYPE_CHECKING:
    from engine.score.classifier import Classifier
    from engine.score.head_config import score_method
    from engine.score.outputs import ClassifyResult, ScoreOutput
    from engine.score.pairs import PairScorer
    from engine.score.params import ClassifyParams, ScoreParams
    from engine.score.top_n import top_n


__getattr__ = lazy_names(__name__, _WHERE)
