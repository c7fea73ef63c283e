"""ModernBERT over packed batches: token ids -> hidden states.

What differs from BERT: pre-norm blocks (LayerNorm, no bias unless configured; the first
block has no attention norm because the embedding norm precedes it), rotary positions
instead of a position table, a GeGLU MLP, a final norm, no token types, and attention
that alternates: every `global_attn_every_n_layers`-th layer (from layer 0) attends over
the whole text with rotary theta `global_rope_theta`; the others see only tokens within
local_attention // 2 positions each side, with theta `local_rope_theta`.

NOTE: the local window is a band mask inside each text of the packed batch, built once
per forward for each run of equal-length texts (engine/layers/attention.py); a text no
longer than the band needs no mask at all. Padding still costs nothing.

NOTE: on CUDA (or with `fused_ops=True`) the small ops between the matmuls run as one
Triton kernel each, as in engine/models/bert.py: the embedding gather and its norm; q and
k rotated in place inside the fused QKV output; GeGLU with Wi's bias; and each residual
add, with its linear's bias, fused into the next LayerNorm, so a layer carries (the MLP's
output not yet added, the residual stream) and the final norm adds the last one. The CPU
path is the PyTorch ops as written below.

Module names are the checkpoint's (Wqkv, Wi, Wo, ...), so weights load by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.embed.batching import PackedBatch
from engine.generate.rotary import apply_rotary
from engine.layers.attention import SlidingWindow, cpu_kernel_runs_widened, packed_attention, sliding_window
from engine.layers.linear import ACTIVATIONS, GELU_APPROXIMATE, linear_residual, linear_unbiased

DEFAULT_GLOBAL_ROPE_THETA, DEFAULT_LOCAL_ROPE_THETA = 160_000.0, 10_000.0
CHECKPOINT_PREFIX = "model."                    # ModernBertForMaskedLM and friends
Rope = tuple[torch.Tensor, torch.Tensor]        # cos, sin [num_tokens, 1, head_dim], float32
# A linear's product and the bias still to add to it (None: added, or none): the fused path
# adds it in the kernel that takes the product next (engine.layers.linear.linear_unbiased).
Unbiased = tuple[torch.Tensor, torch.Tensor | None]


@dataclass(frozen=True)
class ModernBertConfig:
    """The architecture of a ModernBERT encoder, from its config.json (either the original
    keys or the layer_types / rope_parameters that transformers 5 writes)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int      # of each GeGLU half: Wi is [2 * intermediate_size, hidden]
    hidden_act: str             # "gelu" | "gelu_new" | "gelu_pytorch_tanh" | "relu"
    norm_eps: float
    norm_bias: bool
    attention_bias: bool
    mlp_bias: bool
    max_position_embeddings: int
    local_attention: int        # the whole local window: local_attention // 2 tokens each side
    is_global: tuple[bool, ...] # [num_layers]: full attention, else local
    global_rope_theta: float
    local_rope_theta: float

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads {self.num_heads}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"unsupported hidden_activation {self.hidden_act!r}; expected one of {sorted(ACTIVATIONS)}")
        if len(self.is_global) != self.num_layers:
            raise ValueError(f"layer_types names {len(self.is_global)} layers, num_hidden_layers is {self.num_layers}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def max_positions(self) -> int:
        return self.max_position_embeddings


def modernbert_config_from_hf(hf: dict) -> ModernBertConfig:
    num_layers = hf["num_hidden_layers"]
    layer_types = hf.get("layer_types")
    if layer_types is None:
        every = hf.get("global_attn_every_n_layers", 3)
        layer_types = ["full_attention" if index % every == 0 else "sliding_attention" for index in range(num_layers)]
    unknown = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
    if unknown:
        raise ValueError(f"unsupported ModernBERT layer_types {unknown}")
    rope = hf.get("rope_parameters") or {}
    for kind in ("full_attention", "sliding_attention"):
        rope_type = (rope.get(kind) or {}).get("rope_type", "default")
        if rope_type != "default":
            raise ValueError(f"unsupported rope_type {rope_type!r} for ModernBERT {kind} layers; supported: default")
    return ModernBertConfig(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=num_layers,
        num_heads=hf["num_attention_heads"], intermediate_size=hf["intermediate_size"],
        hidden_act=hf.get("hidden_activation", "gelu"), norm_eps=hf.get("norm_eps", 1e-5),
        norm_bias=bool(hf.get("norm_bias", False)), attention_bias=bool(hf.get("attention_bias", False)),
        mlp_bias=bool(hf.get("mlp_bias", False)), max_position_embeddings=hf.get("max_position_embeddings", 8192),
        local_attention=hf.get("local_attention", 128),
        is_global=tuple(kind == "full_attention" for kind in layer_types),
        global_rope_theta=float((rope.get("full_attention") or {}).get(
            "rope_theta", hf.get("global_rope_theta", DEFAULT_GLOBAL_ROPE_THETA))),
        local_rope_theta=float((rope.get("sliding_attention") or {}).get(
            "rope_theta", hf.get("local_rope_theta", DEFAULT_LOCAL_ROPE_THETA))),
    )


def checkpoint_name_to_ours(name: str) -> str | None:
    """Keep the encoder's tensors; drop heads (MLM head, decoder, classifier)."""
    name = name.removeprefix(CHECKPOINT_PREFIX)
    return name if name.startswith(("embeddings.", "layers.", "final_norm.")) else None


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> Rope:
    """positions [num_tokens] -> cos, sin [num_tokens, 1, head_dim] in float32 (rotate-half layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]
    return angles.cos(), angles.sin()


class ModernBertEmbeddings(nn.Module):
    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.tok_embeddings(input_ids))

    def fused(self, input_ids: torch.Tensor) -> torch.Tensor:
        from engine.kernels import fused_encoder_ops    # triton is imported only where it is used
        return fused_encoder_ops.embedding_layer_norm(input_ids, self.tok_embeddings.weight, self.norm.weight,
                                                      self.norm.bias, self.norm.eps)


class ModernBertAttention(nn.Module):
    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.Wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.attention_bias)
        self.Wo = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)

    def forward(self, normed: torch.Tensor, residual: torch.Tensor, rope: Rope, batch: PackedBatch,
                window: SlidingWindow | None) -> torch.Tensor:
        """residual + attention(normed); both [num_tokens, hidden]."""
        q, k, v = self.Wqkv(normed).view(-1, 3, self.num_heads, self.head_dim).unbind(1)
        # Rotated in fp32 as the reference does; only 16-bit runs see the difference.
        q, k = apply_rotary(q.float(), k.float(), *rope)
        if cpu_kernel_runs_widened(normed):     # bf16 on CPU: the fp32 kernel (engine.layers.attention)
            attended = packed_attention(q, k, v.float(), batch.groups, window, cu_seqlens=batch.cu_seqlens)
            return linear_residual(attended.flatten(1).to(normed.dtype), self.Wo, residual)
        q, k = q.to(normed.dtype), k.to(normed.dtype)
        attended = packed_attention(q, k, v, batch.groups, window, cu_seqlens=batch.cu_seqlens)
        return linear_residual(attended.flatten(1), self.Wo, residual)

    def forward_fused(self, normed: torch.Tensor, rope: Rope, batch: PackedBatch,
                      window: SlidingWindow | None) -> Unbiased:
        """attention(normed), Wo's bias not yet added; q and k rotated in place in the QKV
        output (in fp32 inside the kernel, rounded once, as the PyTorch path rounds them)."""
        from engine.kernels import fused_ops
        qkv = self.Wqkv(normed)
        heads = qkv.view(qkv.shape[0], 3 * self.num_heads, self.head_dim)     # q heads, k heads, v heads
        fused_ops.rotary_(heads[:, :2 * self.num_heads], *rope)
        q, k, v = heads.unflatten(1, (3, self.num_heads)).unbind(1)
        attended = packed_attention(q, k, v, batch.groups, window, cu_seqlens=batch.cu_seqlens)
        return linear_unbiased(attended.flatten(1), self.Wo)


class ModernBertMLP(nn.Module):
    """GeGLU: Wo(act(x Wi_in) * x Wi_gate)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.Wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.act = ACTIVATIONS[config.hidden_act]
        self.hidden_act = config.hidden_act

    def forward(self, normed: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        inner, gate = self.Wi(normed).chunk(2, dim=-1)
        return linear_residual(self.act(inner) * gate, self.Wo, residual)

    def forward_fused(self, normed: torch.Tensor) -> Unbiased:
        """The MLP's output, Wo's bias not yet added; GeGLU in one kernel with Wi's bias."""
        if self.hidden_act in GELU_APPROXIMATE:
            from engine.kernels import fused_encoder_ops
            activated = fused_encoder_ops.gelu_and_mul(*linear_unbiased(normed, self.Wi),
                                                       GELU_APPROXIMATE[self.hidden_act])
        else:
            inner, gate = self.Wi(normed).chunk(2, dim=-1)
            activated = self.act(inner) * gate
        return linear_unbiased(activated, self.Wo)


class ModernBertLayer(nn.Module):
    """Pre-norm block: x = x + attn(norm(x)); x = x + mlp(norm(x))."""

    def __init__(self, config: ModernBertConfig, index: int):
        super().__init__()
        # Layer 0 reads the embedding norm's output: the checkpoint has no attn_norm for it.
        self.attn_norm = (nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
                          if index else nn.Identity())
        self.attn = ModernBertAttention(config)
        self.mlp_norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
        self.mlp = ModernBertMLP(config)
        self.is_global = config.is_global[index]

    def forward(self, hidden: torch.Tensor, rope: Rope, batch: PackedBatch,
                window: SlidingWindow | None) -> torch.Tensor:
        hidden = self.attn(self.attn_norm(hidden), hidden, rope, batch, window)
        return self.mlp(self.mlp_norm(hidden), hidden)

    def forward_fused(self, pending: Unbiased | None, residual: torch.Tensor, rope: Rope, batch: PackedBatch,
                      window: SlidingWindow | None) -> tuple[Unbiased, torch.Tensor]:
        """pending: the previous layer's MLP output, not yet added to residual (the stream so
        far, which this adds to in place); None before the first layer, where residual is the
        embeddings' output. Returns this layer's MLP output (pending for the next) and the stream."""
        from engine.kernels import fused_encoder_ops as ops
        if pending is None:
            normed = self.attn_norm(residual)
        else:
            norm = self.attn_norm
            normed = ops.add_layer_norm_(pending[0], residual, norm.weight, norm.bias, norm.eps, x_bias=pending[1])
        attended, bias = self.attn.forward_fused(normed, rope, batch, window)
        norm = self.mlp_norm
        normed = ops.add_layer_norm_(attended, residual, norm.weight, norm.bias, norm.eps, x_bias=bias)
        return self.mlp.forward_fused(normed), residual


class ModernBertModel(nn.Module):
    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.config = config
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = nn.ModuleList(ModernBertLayer(config, index) for index in range(config.num_layers))
        self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
        self.fused_ops: bool | None = None      # the Triton path; None: on CUDA only

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """A packed batch (on this model's device) -> last hidden states [num_tokens, hidden]."""
        if self.fused_ops or (self.fused_ops is None and batch.input_ids.is_cuda):
            return self._forward_fused(batch)
        hidden = self.embeddings(batch.input_ids)
        for layer, (rope, window) in zip(self.layers, self._attention_inputs(batch, hidden)):
            hidden = layer(hidden, rope, batch, window)
        return self.final_norm(hidden)

    def _forward_fused(self, batch: PackedBatch) -> torch.Tensor:
        from engine.kernels import fused_encoder_ops
        residual, pending = self.embeddings.fused(batch.input_ids), None
        for layer, (rope, window) in zip(self.layers, self._attention_inputs(batch, residual)):
            pending, residual = layer.forward_fused(pending, residual, rope, batch, window)
        norm = self.final_norm
        return fused_encoder_ops.layer_norm(pending[0], norm.weight, norm.bias, norm.eps, residual=residual,
                                            x_bias=pending[1])

    def _attention_inputs(self, batch: PackedBatch, hidden: torch.Tensor) -> list[tuple[Rope, SlidingWindow | None]]:
        """Per layer, its rotary cos/sin and its window (None: a global layer), built once per forward."""
        config = self.config
        global_rope = rope_cos_sin(batch.positions, config.head_dim, config.global_rope_theta)
        local_rope = rope_cos_sin(batch.positions, config.head_dim, config.local_rope_theta)
        # bf16 on CPU attends in fp32 (the kernel applies the band itself): no masks built for it.
        like = hidden.new_empty(0, dtype=torch.float32) if cpu_kernel_runs_widened(hidden) else hidden
        local_window = sliding_window(batch.groups, config.local_attention // 2, like)
        return [(global_rope, None) if layer.is_global else (local_rope, local_window) for layer in self.layers]
