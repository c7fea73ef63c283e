"""Word timing from cross-attention: which encoder frames each text token looked at.

    chunk's text tokens → one decoder pass over  sot-sequence <|notimestamps|> text <|endoftext|>
        → cross-attention weights of the alignment heads [heads, tokens, frames]
        → softmax over the chunk's frames, standardised per frame over the tokens, median filter (7)
        → mean over heads → DTW (least negative attention) → where each token's row starts
        → per word: start = its first token's start, end = the next word's start;
          probability = mean of its tokens' probabilities (text vocabulary only)

This is openai-whisper's find_alignment (timing.py), built again on Barge's model so
that the same weights give the same times. The alignment heads are the checkpoint's
(CTranslate2 and Hugging Face ship them); without them, every head of the decoder's
second half, openai-whisper's own default.

NOTE: the rows entering DTW are <|notimestamps|> and the text tokens (not eot), so the
path's first jump into row k is where token k-1 ends: a word's "start" is the end of the
token before it. That is the reference's convention and word times depend on it.

Several chunks are aligned in one batched decoder pass: rows are padded at the end, and
causal self-attention keeps every real position blind to the padding after it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from engine.whisper.config import HOP_LENGTH, SAMPLE_RATE
from engine.whisper.decoder_step import attention_backends
from engine.whisper.dtw import dtw, median_filter
from engine.whisper.model import Whisper
from engine.whisper.tokenizer import WhisperTokenizer

MEDIAN_FILTER_WIDTH = 7
TOKENS_PER_SECOND = SAMPLE_RATE / (2 * HOP_LENGTH)     # encoder positions per second: 50


@dataclass
class WordTiming:
    word: str            # with its leading space, as decoded
    tokens: list[int]
    start: float         # seconds from the chunk's start
    end: float
    probability: float   # mean of its tokens' probabilities


@dataclass(frozen=True)
class AlignmentInput:
    """One chunk to align."""

    audio_features: torch.Tensor     # [n_audio_ctx, n_audio_state]: the encoder output it was decoded from
    sot_sequence: list[int]          # <|startoftranscript|> [<|lang|> <|task|>]
    text_tokens: list[int]           # what was decoded, timestamps and eot removed
    num_frames: int                  # mel frames of audio in the chunk (10 ms each; the rest is padding)
    language: str | None


def alignment_heads(model: Whisper) -> list[tuple[int, int]]:
    config = model.config
    if config.alignment_heads:
        return [tuple(pair) for pair in config.alignment_heads]
    return [(layer, head) for layer in range(config.n_text_layer // 2, config.n_text_layer)
            for head in range(config.n_text_head)]


@torch.inference_mode()
def align(model: Whisper, tokenizer: WhisperTokenizer, chunks: list[AlignmentInput]) -> list[list[WordTiming]]:
    """Word timings of each chunk, in order; a chunk without text tokens has none."""
    todo = [index for index, chunk in enumerate(chunks) if chunk.text_tokens]
    results: list[list[WordTiming]] = [[] for _ in chunks]
    if not todo:
        return results
    sequences = [[*chunks[i].sot_sequence, tokenizer.no_timestamps, *chunks[i].text_tokens, tokenizer.eot]
                 for i in todo]
    logits, cross_qk = decoder_pass(model, sequences, torch.stack([chunks[i].audio_features for i in todo]))
    for row, index in enumerate(todo):
        chunk = chunks[index]
        length = len(sequences[row])
        matrix = _attention_matrix(cross_qk[row, :, :length], chunk.num_frames, len(chunk.sot_sequence))
        start = len(chunk.sot_sequence)
        probs = logits[row, start:start + len(chunk.text_tokens), :tokenizer.eot].float().softmax(dim=-1)
        token_probs = probs[torch.arange(len(chunk.text_tokens)), torch.tensor(chunk.text_tokens)].tolist()
        results[index] = _words(tokenizer, chunk, matrix, token_probs)
    return results


def decoder_pass(model: Whisper, sequences: list[list[int]], features: torch.Tensor,
                 heads: list[tuple[int, int]] | None = None):
    """Padded sequences through the decoder -> (logits [b, T, vocab], cross-attention
    scores of `heads` (default: the alignment heads) [b, heads, T, n_audio_ctx], float32;
    None without heads)."""
    with attention_backends(features.device):     # no cuDNN plan per batch length (decoder_step.py)
        return _decoder_pass(model, sequences, features, heads)


def _decoder_pass(model: Whisper, sequences: list[list[int]], features: torch.Tensor,
                  heads: list[tuple[int, int]] | None):
    decoder = model.decoder
    heads = alignment_heads(model) if heads is None else heads
    device = features.device
    length = max(len(s) for s in sequences)
    tokens = torch.full((len(sequences), length), sequences[0][-1], dtype=torch.long, device=device)
    for row, sequence in enumerate(sequences):
        tokens[row, :len(sequence)] = torch.tensor(sequence, device=device)
    x = decoder.token_embedding(tokens) + decoder.positional_embedding[:length]
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    wanted: dict[int, list[int]] = {}
    for layer, head in heads:
        wanted.setdefault(layer, []).append(head)
    scores: dict[tuple[int, int], torch.Tensor] = {}
    for layer, block in enumerate(decoder.blocks):
        h = block.attn_ln(x)
        x = x + block.attn.attend(block.attn.query(h), block.attn.key(h), block.attn.value(h), causal)
        h = block.cross_attn_ln(x)
        out, qk = _cross_attention(block.cross_attn, h, features)
        x = x + out
        for head in wanted.get(layer, []):
            scores[(layer, head)] = qk[:, head]
        x = x + block.mlp(block.mlp_ln(x))
    logits = (decoder.ln(x) @ decoder.token_embedding.weight.T).float()
    return logits, torch.stack([scores[pair] for pair in heads], dim=1).float() if heads else None


def _cross_attention(attention, h: torch.Tensor, features: torch.Tensor):
    """Cross-attention with its pre-softmax scores kept: (output, qk [b, heads, T, n_audio_ctx])."""
    num_heads = attention.n_head
    q, k, v = attention.query(h), attention.key(features), attention.value(features)
    batch, length, state = q.shape
    scale = (state // num_heads) ** -0.25
    q = q.view(batch, length, num_heads, -1).transpose(1, 2) * scale
    k = k.view(batch, k.shape[1], num_heads, -1).transpose(1, 2) * scale
    v = v.view(batch, v.shape[1], num_heads, -1).transpose(1, 2)
    qk = (q @ k.transpose(-1, -2)).float()
    weights = qk.softmax(dim=-1).to(q.dtype)
    out = (weights @ v).transpose(1, 2).reshape(batch, length, state)
    return attention.out(out), qk


def _attention_matrix(qk: torch.Tensor, num_frames: int, num_sot: int) -> np.ndarray:
    """qk [heads, tokens, n_audio_ctx] -> [1 + text tokens, frames] mean normalised weights
    (rows: <|notimestamps|> and the text tokens)."""
    weights = qk[:, :, :num_frames // 2].softmax(dim=-1)
    std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
    weights = median_filter((weights - mean) / std, MEDIAN_FILTER_WIDTH)
    return weights.mean(dim=0)[num_sot:-1].double().cpu().numpy()


def _words(tokenizer: WhisperTokenizer, chunk: AlignmentInput, matrix: np.ndarray,
           token_probs: list[float]) -> list[WordTiming]:
    text_indices, time_indices = dtw(-matrix)
    words, word_tokens = tokenizer.split_to_word_tokens(chunk.text_tokens + [tokenizer.eot], chunk.language)
    if len(word_tokens) <= 1:
        return []
    boundaries = np.concatenate([[0], np.cumsum([len(tokens) for tokens in word_tokens[:-1]])])
    jumps = np.concatenate([[True], np.diff(text_indices) != 0])
    jump_times = time_indices[jumps] / TOKENS_PER_SECOND
    return [WordTiming(word, tokens, float(jump_times[lo]), float(jump_times[hi]),
                       float(np.mean(token_probs[lo:hi])))
            for word, tokens, lo, hi in zip(words, word_tokens, boundaries[:-1], boundaries[1:])]
