"""Llama-family decoder (Llama, Mistral, Qwen2, Qwen3): over a paged KV cache for generation
(LlamaForCausalLM), over a packed batch for embeddings (LlamaForEmbedding).

One module for the family: Qwen2 adds a bias to q/k/v, Qwen3 an RMSNorm on each head
of q and k; everything else is Llama. Q/K/V and gate/up are fused into one matmul each
(CPU matmuls are faster wide), so `pack_hf_weights` concatenates the checkpoint's.

NOTE: two paths through a generate layer, one result. On CPU (and for the embedder) the
layer is the PyTorch ops as written below; their results and speed are what the parity
tests pin. On CUDA (or with `fused_ops=True`) the small ops between the matmuls run as one
Triton kernel each (engine/kernels/fused_ops.py): the residual add is fused into the next
RMSNorm, so a layer carries (hidden, residual) and adds the last residual in the final norm;
SiLU-and-multiply is one kernel; q and k are rotated in place inside the fused QKV output.
That is about 8 launches per layer besides attention instead of about 35, and none syncs
with the host, so the decode step can be captured in a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from engine.embed.batching import PackedBatch, SharedPrefix, pack
from engine.generate.attention import AttentionMetadata, paged_attention
from engine.generate.kv_cache import KVCache, LayerKVCache
from engine.generate.model_config import DecoderConfig
from engine.generate.rotary import Rotary, apply_rotary
from engine.layers.attention import attend_after_prefix, packed_attention

if TYPE_CHECKING:
    from engine.lora.batch import LoraBatch

Rope = tuple[torch.Tensor, torch.Tensor]     # cos, sin [num_tokens, 1, head_dim], computed once per step
# An embedder layer's attention: (layer index, q, k, v) -> attended, shaped like q
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _linear(layer: nn.Module, x: torch.Tensor, lora: LoraBatch | None) -> torch.Tensor:
    """A step with LoRA tokens hands its LoraBatch to the layer, a LoraLinear (engine/lora/linear.py,
    swapped in at load when the engine serves adapters); any other step calls the layer as it is."""
    return layer(x) if lora is None else layer(x, lora)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 like the reference: bf16 variance drifts on long hidden states.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def fused(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """One kernel: the norm of x, or, given the residual stream, residual += x (in place)
        and the norm of the sum."""
        from engine.kernels import fused_ops    # triton is imported only where it is used
        if residual is None:
            return fused_ops.rms_norm(x, self.weight, self.eps)
        return fused_ops.add_rms_norm(x, residual, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.scale = self.head_dim ** -0.5

    def forward(self, hidden: torch.Tensor, rope: Rope, meta: AttentionMetadata,
                kv_cache: LayerKVCache, lora: LoraBatch | None = None) -> torch.Tensor:
        q, k, v = self.project(hidden, rope, lora)
        out = paged_attention(q, k, v, kv_cache, meta, self.scale)
        return _linear(self.o_proj, out.reshape(-1, self.q_size), lora)

    def project(self, hidden: torch.Tensor, rope: Rope,
                lora: LoraBatch | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """hidden [num_tokens, hidden_size] -> q [num_tokens, num_heads, head_dim] and k, v
        [num_tokens, num_kv_heads, head_dim], q and k normed (Qwen3) and rotated."""
        q, k, v = _linear(self.qkv_proj, hidden, lora).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, k, *rope)
        return q, k, v

    def forward_fused(self, hidden: torch.Tensor, rope: Rope, meta: AttentionMetadata,
                      kv_cache: LayerKVCache, lora: LoraBatch | None = None) -> torch.Tensor:
        q, k, v = self.project_fused(hidden, rope, lora)
        out = paged_attention(q, k, v, kv_cache, meta, self.scale)
        return _linear(self.o_proj, out.reshape(-1, self.q_size), lora)

    def project_fused(self, hidden: torch.Tensor, rope: Rope,
                      lora: LoraBatch | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As project, with q and k rotated in place: one kernel over q's and k's heads side
        by side in the QKV output (views of it come back), or two after Qwen3's q/k norms."""
        from engine.kernels import fused_ops
        qkv = _linear(self.qkv_proj, hidden, lora)
        num_tokens = qkv.shape[0]
        heads = qkv.view(num_tokens, -1, self.head_dim)     # q heads, then k heads, then v heads
        v = heads[:, self.num_heads + self.num_kv_heads:]
        if self.q_norm is None:
            fused_ops.rotary_(heads[:, :self.num_heads + self.num_kv_heads], *rope)
            return heads[:, :self.num_heads], heads[:, self.num_heads:self.num_heads + self.num_kv_heads], v
        q = self.q_norm(heads[:, :self.num_heads])
        k = self.k_norm(heads[:, self.num_heads:self.num_heads + self.num_kv_heads])
        return fused_ops.rotary_(q, *rope), fused_ops.rotary_(k, *rope), v


class MLP(nn.Module):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, lora: LoraBatch | None = None) -> torch.Tensor:
        gate, up = _linear(self.gate_up_proj, x, lora).split(self.intermediate_size, dim=-1)
        return _linear(self.down_proj, F.silu(gate) * up, lora)

    def forward_fused(self, x: torch.Tensor, lora: LoraBatch | None = None) -> torch.Tensor:
        from engine.kernels import fused_ops
        return _linear(self.down_proj, fused_ops.silu_and_mul(_linear(self.gate_up_proj, x, lora)), lora)


class DecoderLayer(nn.Module):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, hidden, rope, meta, kv_cache, lora: LoraBatch | None = None):
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), rope, meta, kv_cache, lora)
        return hidden + self.mlp(self.post_attention_layernorm(hidden), lora)

    def forward_fused(self, hidden: torch.Tensor, residual: torch.Tensor | None, rope: Rope, meta: AttentionMetadata,
                      kv_cache: LayerKVCache, lora: LoraBatch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: the previous layer's MLP output, not yet added to residual (the stream so
        far; None before the first layer, where hidden is the embedding and starts it)."""
        if residual is None:
            residual, normed = hidden, self.input_layernorm.fused(hidden)
        else:
            normed = self.input_layernorm.fused(hidden, residual)
        attended = self.self_attn.forward_fused(normed, rope, meta, kv_cache, lora)
        return self.mlp.forward_fused(self.post_attention_layernorm.fused(attended, residual), lora), residual


class LlamaModel(nn.Module):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """forward: flat token ids [num_tokens] -> final hidden states [num_tokens, hidden_size];
    lora: the step's adapters per token (engine/lora/), None for a base-only step."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.config = config
        self.rotary = Rotary(config)
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.fused_ops: bool | None = None      # the Triton layer path; None: on CUDA only

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_cache: KVCache, lora: LoraBatch | None = None) -> torch.Tensor:
        hidden = self.model.embed_tokens(input_ids)
        rope = self.rotary.cos_sin(positions, hidden.dtype)
        if self.fused_ops or (self.fused_ops is None and hidden.is_cuda):
            return self._forward_fused(hidden, rope, meta, kv_cache, lora)
        for layer, layer_cache in zip(self.model.layers, kv_cache):
            hidden = layer(hidden, rope, meta, layer_cache, lora)
        return self.model.norm(hidden)

    def _forward_fused(self, hidden: torch.Tensor, rope: Rope, meta: AttentionMetadata,
                       kv_cache: KVCache, lora: LoraBatch | None) -> torch.Tensor:
        residual = None
        for layer, layer_cache in zip(self.model.layers, kv_cache):
            hidden, residual = layer.forward_fused(hidden, residual, rope, meta, layer_cache, lora)
        return self.model.norm.fused(hidden, residual)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Only for the rows that are sampled or scored: the LM head is the widest matmul."""
        return self.lm_head(hidden).float()


class LlamaForEmbedding(nn.Module):
    """The same decoder as an embedding model (Qwen3-Embedding and other LLM-based embedders):
    forward: a packed batch -> final hidden states [num_tokens, hidden_size].

    Every text is a whole prompt seen once, so there is no KV cache and no LM head: the
    layers' attention is causal within each text of the packed batch (engine/embed/batching.py),
    and the embedder pools the hidden states (usually the last token's). On CUDA (or with
    `fused_ops=True`) the layers take the generate decoder's fused kernels (see the NOTE at
    the top), attention still over the packed batch.

    A batch behind a shared prefix (batch.prefix, from encode_prefix: an instruction every
    text starts with) holds only the texts' own tokens, which attend to the prefix's kept
    keys and values (engine.layers.attention.attend_after_prefix): SDPA per group on every
    device, as neither attention kernel (C++ on CPU, Triton on CUDA) takes a prefix. The
    layers' other ops take the fused kernels where they run, as without a prefix.
    """

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.config = config
        self.rotary = Rotary(config)
        self.model = LlamaModel(config)
        self.fused_ops: bool | None = None      # the Triton layer path; None: on CUDA only

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        hidden = self.model.embed_tokens(batch.input_ids)
        rope = self.rotary.cos_sin(batch.positions, hidden.dtype)
        attend = causal_attention(batch)
        if self.fused_ops or (self.fused_ops is None and hidden.is_cuda):
            return self._forward_fused(hidden, rope, attend)
        return self._run_layers(hidden, rope, attend)

    def encode_prefix(self, token_ids: list[int]) -> SharedPrefix:
        """Run the tokens every text of a call starts with, once, as a text of their own,
        keeping each layer's rotated keys and values for the texts behind them to attend to."""
        batch = pack([token_ids], [0]).to(self.model.embed_tokens.weight.device)
        keys, values = [], []
        attend_alone = causal_attention(batch)

        def attend(index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            keys.append(k)
            values.append(v)
            return attend_alone(index, q, k, v)

        hidden = self.model.embed_tokens(batch.input_ids)
        hidden = self._run_layers(hidden, self.rotary.cos_sin(batch.positions, hidden.dtype), attend)
        return SharedPrefix(tuple(token_ids), tuple(keys), tuple(values), hidden)

    def _run_layers(self, hidden: torch.Tensor, rope: Rope, attend: Attend) -> torch.Tensor:
        """The layers as PyTorch ops, attention by `attend` (layer index, q, k, v -> like q)."""
        for index, layer in enumerate(self.model.layers):
            attention = layer.self_attn
            q, k, v = attention.project(layer.input_layernorm(hidden), rope)
            attended = attend(index, q, k, v)
            hidden = hidden + attention.o_proj(attended.reshape(-1, attention.q_size))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.model.norm(hidden)

    def _forward_fused(self, hidden: torch.Tensor, rope: Rope, attend: Attend) -> torch.Tensor:
        """As DecoderLayer.forward_fused: hidden is each layer's MLP output, added to the
        residual stream in the next norm."""
        residual = None
        for index, layer in enumerate(self.model.layers):
            attention = layer.self_attn
            if residual is None:
                residual, normed = hidden, layer.input_layernorm.fused(hidden)
            else:
                normed = layer.input_layernorm.fused(hidden, residual)
            q, k, v = attention.project_fused(normed, rope)
            attended = attention.o_proj(attend(index, q, k, v).reshape(-1, attention.q_size))
            hidden = layer.mlp.forward_fused(layer.post_attention_layernorm.fused(attended, residual))
        return self.model.norm.fused(hidden, residual)


def causal_attention(batch: PackedBatch) -> Attend:
    """An embedder layer's attention over a packed batch: causal within each text, and
    behind batch.prefix where the batch has one."""
    prefix = batch.prefix
    if prefix is None:
        return lambda index, q, k, v: packed_attention(q, k, v, batch.groups, is_causal=True,
                                                       cu_seqlens=batch.cu_seqlens)
    return lambda index, q, k, v: attend_after_prefix(q, k, v, batch.groups, prefix.keys[index],
                                                      prefix.values[index])


def embedding_checkpoint_name_to_ours(name: str) -> str | None:
    """Names as LlamaForEmbedding has them: a base-model checkpoint (what sentence-transformers
    saves, e.g. Qwen3-Embedding) lacks the "model." prefix; a causal-LM one has it, and an LM
    head the embedder never uses."""
    if name.startswith("lm_head.") or "rotary_emb" in name:
        return None
    return name if name.startswith("model.") else f"model.{name}"


def pack_hf_weights(state: dict[str, torch.Tensor], config: DecoderConfig) -> dict[str, torch.Tensor]:
    """Checkpoint tensors (Hugging Face names) -> this module's, fusing q/k/v and gate/up."""
    state = dict(state)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    for index in range(config.num_layers):
        prefix = f"model.layers.{index}."
        # weight_scale: an FP8 weight's row-form scale (engine/quant/fp8.py) fuses the same way.
        for kind in ("weight", "bias", "weight_scale"):
            names = [f"{prefix}self_attn.{p}_proj.{kind}" for p in "qkv"]
            if all(name in state for name in names):
                state[f"{prefix}self_attn.qkv_proj.{kind}"] = torch.cat([state.pop(name) for name in names])
        for kind in ("weight", "weight_scale"):
            names = [f"{prefix}mlp.{p}_proj.{kind}" for p in ("gate", "up")]
            if all(name in state for name in names):
                state[f"{prefix}mlp.gate_up_proj.{kind}"] = torch.cat([state.pop(name) for name in names])
    for name in [name for name in state if "rotary_emb" in name]:
        del state[name]     # inv_freq buffers some checkpoints carry; ours is derived from the config
    return state
