"""Whisper in plain PyTorch: a batched encoder and a decoder that steps slots of a DecoderCache.

Module and parameter names are openai-whisper's, so its checkpoints load as they are
(engine.whisper.loader converts the other layouts to these names).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.whisper.config import WhisperConfig
from engine.whisper.kv_cache import DecoderCache


def _split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[batch, length, state] -> [batch, heads, length, head_dim]"""
    batch, length, state = x.shape
    return x.view(batch, length, num_heads, state // num_heads).transpose(1, 2)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    batch, heads, length, head_dim = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * head_dim)


class Attention(nn.Module):
    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(n_state, n_state)
        self.key = nn.Linear(n_state, n_state, bias=False)
        self.value = nn.Linear(n_state, n_state)
        self.out = nn.Linear(n_state, n_state)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None):
        heads = self.n_head
        # SDPA's default 1/sqrt(head_dim) equals openai-whisper's head_dim**-0.25 on q and on k.
        out = F.scaled_dot_product_attention(_split_heads(q, heads), _split_heads(k, heads),
                                             _split_heads(v, heads), attn_mask=mask)
        return self.out(_merge_heads(out))


class EncoderBlock(nn.Module):
    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.attn = Attention(n_state, n_head)
        self.attn_ln = nn.LayerNorm(n_state)
        self.mlp = nn.Sequential(nn.Linear(n_state, 4 * n_state), nn.GELU(), nn.Linear(4 * n_state, n_state))
        self.mlp_ln = nn.LayerNorm(n_state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attn_ln(x)
        x = x + self.attn.attend(self.attn.query(h), self.attn.key(h), self.attn.value(h))
        return x + self.mlp(self.mlp_ln(x))


class AudioEncoder(nn.Module):
    def __init__(self, c: WhisperConfig):
        super().__init__()
        self.conv1 = nn.Conv1d(c.n_mels, c.n_audio_state, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(c.n_audio_state, c.n_audio_state, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positional_embedding", torch.zeros(c.n_audio_ctx, c.n_audio_state))
        self.blocks = nn.ModuleList(EncoderBlock(c.n_audio_state, c.n_audio_head) for _ in range(c.n_audio_layer))
        self.ln_post = nn.LayerNorm(c.n_audio_state)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """[batch, n_mels, 3000] -> [batch, n_audio_ctx, n_audio_state]"""
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).permute(0, 2, 1)
        x = x + self.positional_embedding
        for block in self.blocks:
            x = block(x)
        return self.ln_post(x)


class DecoderBlock(nn.Module):
    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.attn = Attention(n_state, n_head)
        self.attn_ln = nn.LayerNorm(n_state)
        self.cross_attn = Attention(n_state, n_head)
        self.cross_attn_ln = nn.LayerNorm(n_state)
        self.mlp = nn.Sequential(nn.Linear(n_state, 4 * n_state), nn.GELU(), nn.Linear(4 * n_state, n_state))
        self.mlp_ln = nn.LayerNorm(n_state)

    def step(self, x: torch.Tensor, layer: int, cache: DecoderCache, positions: torch.Tensor,
             self_mask: torch.Tensor) -> torch.Tensor:
        """x [n, 1, state] for slots 0..n-1, each at its own position; its self K/V row is
        written into the cache in place, then attended with the rows before it."""
        n, length = x.shape[0], self_mask.shape[-1]
        slots = torch.arange(n, device=x.device)
        h = self.attn_ln(x)
        cache.self_k[layer, slots, positions] = self.attn.key(h)[:, 0]
        cache.self_v[layer, slots, positions] = self.attn.value(h)[:, 0]
        keys, values = cache.self_k[layer, :n, :length], cache.self_v[layer, :n, :length]
        x = x + self.attn.attend(self.attn.query(h), keys, values, self_mask)
        h = self.cross_attn_ln(x)
        x = x + self.cross_attn.attend(self.cross_attn.query(h), cache.cross_k[layer, :n], cache.cross_v[layer, :n])
        return x + self.mlp(self.mlp_ln(x))


class TextDecoder(nn.Module):
    def __init__(self, c: WhisperConfig):
        super().__init__()
        self.token_embedding = nn.Embedding(c.n_vocab, c.n_text_state)
        self.positional_embedding = nn.Parameter(torch.zeros(c.n_text_ctx, c.n_text_state))
        self.blocks = nn.ModuleList(DecoderBlock(c.n_text_state, c.n_text_head) for _ in range(c.n_text_layer))
        self.ln = nn.LayerNorm(c.n_text_state)

    def write_cross(self, cache: DecoderCache, slots: list[int], audio_features: torch.Tensor) -> None:
        """Cross-attention K/V of `audio_features` [k, n_audio_ctx, state] into `slots` (k of them)."""
        for layer, block in enumerate(self.blocks):
            cache.cross_k[layer, slots] = block.cross_attn.key(audio_features)
            cache.cross_v[layer, slots] = block.cross_attn.value(audio_features)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, cache: DecoderCache,
             length: int | None = None) -> torch.Tensor:
        """One token for each of slots 0..n-1 at `positions` [n] -> logits [n, n_vocab] (float32).

        Self-attention reads the first `length` cache rows of each slot, masked past the
        slot's own position; None: up to the furthest position (a host sync). A fixed
        length keeps the shapes of every step the same (engine.whisper.decoder_step)."""
        x = (self.token_embedding(tokens) + self.positional_embedding[positions])[:, None, :]
        length = int(positions.max()) + 1 if length is None else length
        # [n, 1, 1, length]: a slot sees its own positions up to and including the new one.
        self_mask = (torch.arange(length, device=tokens.device)[None, :] <= positions[:, None])[:, None, None, :]
        for layer, block in enumerate(self.blocks):
            x = block.step(x, layer, cache, positions, self_mask)
        x = self.ln(x)[:, 0]
        return (x @ self.token_embedding.weight.T).float()


class Whisper(nn.Module):
    def __init__(self, config: WhisperConfig):
        super().__init__()
        self.config = config
        self.encoder = AudioEncoder(config)
        self.decoder = TextDecoder(config)
