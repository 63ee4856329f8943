"""Qwen2 as AReaL's Archon computes it (areal/experimental/models/archon/qwen2/model/model.py,
itself adapted from torchtitan's qwen3), in Archon's shape: built from its args alone (the
engine casts it and gives it storage), ``init_buffers`` computes the RoPE cache, and
``forward(tokens, positions, cu_seqlens, max_seqlen)`` requires cu_seqlens (Archon's engine
packs every batch into one row). Weight tying happens in parallelize_fn, as Archon's.

Numerical choices kept from Archon (they differ from transformers' eager path by rounding):
  * RoPE from a precomputed fp32 cos|sin cache, applied in the [B, T, H, D] layout before the
    heads are transposed (rope.py);
  * attention through Archon's backends: "varlen" (flash attention over the packed row, its
    default) where it runs (CUDA, fp16 / bf16), else "sdpa" (scaled_dot_product_attention with
    a float block-causal mask and enable_gqa); GH_AREAL_ATTN=sdpa|varlen at build time forces
    one (varlen then refuses where it cannot run);
  * RMSNorm with fp32 variance, the weight applied after the cast back; SwiGLU
    w2(silu(w1 x) * w3 x); q/k/v biases (Qwen2), per-head q/k RMSNorm before RoPE (Qwen3,
    ``qk_norm``).

Parameter names are Archon's: tok_embeddings, layers.N.attention_norm,
layers.N.attention.w{q,k,v,o} (+ .bias for q/k/v), layers.N.attention.{q,k}_norm (Qwen3),
layers.N.ffn_norm, layers.N.feed_forward.w{1,2,3}, norm, output.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from gh_areal.attention import SDPAWrapper, VarlenAttentionWrapper, varlen_available
from gh_areal.base import BaseArchonModel
from gh_areal.qwen2.model.rope import apply_rotary_emb, check_positions, precompute_rope_cache

ATTN_ENV = "GH_AREAL_ATTN"
ATTN_TYPES = ("varlen", "sdpa")


class RMSNorm(nn.Module):
    """fp32 mean of squares, rsqrt(var + eps), cast back to the input dtype, then weight *."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        return self.weight * x.to(input_dtype)


class Attention(nn.Module):
    """GQA attention; q/k/v biases when ``attention_bias``, per-head q/k RMSNorm when
    ``qk_norm``. Head counts come from the projections (views with -1 heads), so a
    column-sharded projection gives this rank's heads."""

    def __init__(self, args):
        super().__init__()
        self.head_dim = args.head_dim
        self.scaling = self.head_dim ** -0.5
        bias = bool(args.attention_bias)
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=bias)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=bias)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=bias)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        if getattr(args, "qk_norm", False):
            self.q_norm = RMSNorm(self.head_dim, eps=args.norm_eps)
            self.k_norm = RMSNorm(self.head_dim, eps=args.norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.sdpa = SDPAWrapper()
        self.varlen = VarlenAttentionWrapper()

    def forward(self, x, rope_cache, positions, cu_seqlens, max_seqlen, attn_type):
        bs, seqlen, _ = x.shape
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        if self.q_norm is not None:
            xq = self.q_norm(xq)
            xk = self.k_norm(xk)
        xq, xk = apply_rotary_emb(xq, xk, rope_cache, positions)
        xq, xk, xv = xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2)
        backend = self.varlen if attn_type == "varlen" else self.sdpa
        out = backend(xq, xk, xv, scale=self.scaling, cu_seqlens=cu_seqlens,
                      max_seqlen=max_seqlen)
        out = out.transpose(1, 2).contiguous()
        return self.wo(out.view(bs, seqlen, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args):
        super().__init__()
        self.layer_id = layer_id
        self.attention = Attention(args)
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.feed_forward = FeedForward(args.dim, args.hidden_dim)

    def forward(self, x, rope_cache, positions, cu_seqlens, max_seqlen, attn_type):
        x = x + self.attention(self.attention_norm(x), rope_cache, positions, cu_seqlens,
                               max_seqlen, attn_type)
        return x + self.feed_forward(self.ffn_norm(x))


def resolve_attn_type(default: str) -> str:
    forced = os.environ.get(ATTN_ENV)
    if forced:
        if forced not in ATTN_TYPES:
            raise ValueError(f"{ATTN_ENV}={forced!r}: expected one of {', '.join(ATTN_TYPES)}")
        return forced
    if default not in ATTN_TYPES:
        raise ValueError(f"attn_type {default!r}: this port has {', '.join(ATTN_TYPES)}")
    return default


class Qwen2Model(BaseArchonModel):
    """forward(tokens [1, T], positions [1, T], cu_seqlens [S + 1], max_seqlen) -> logits
    [1, T, vocab_size] in the parameters' dtype: Archon's packed-row forward."""

    def __init__(self, model_args):
        super().__init__()
        self.model_args = model_args
        self.attn_type = resolve_attn_type(model_args.attn_type)
        self.tok_embeddings = nn.Embedding(model_args.vocab_size, model_args.dim)
        self.register_buffer("rope_cache", self._precompute_rope_cache(), persistent=False)
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(i, model_args) for i in range(model_args.n_layers)})
        self.norm = RMSNorm(model_args.dim, eps=model_args.norm_eps)
        self.output = nn.Linear(model_args.dim, model_args.vocab_size, bias=False)

    def _precompute_rope_cache(self) -> torch.Tensor:
        return precompute_rope_cache(self.model_args.head_dim, self.model_args.max_seq_len,
                                     self.model_args.rope_theta)

    def init_buffers(self, buffer_device: torch.device | str) -> None:
        """The fp32 RoPE cache, computed on buffer_device after the parameters got storage."""
        with torch.device(buffer_device):
            self.rope_cache = self._precompute_rope_cache()

    def _attn_type_for(self, h: torch.Tensor) -> str:
        if self.attn_type == "varlen" and not varlen_available(h.device, h.dtype):
            if os.environ.get(ATTN_ENV) == "varlen":
                raise ValueError(f"{ATTN_ENV}=varlen: flash varlen attention needs CUDA and "
                                 f"fp16/bf16, got {h.device.type} {h.dtype}")
            return "sdpa"
        return self.attn_type

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor,
                max_seqlen: int | torch.Tensor) -> torch.Tensor:
        if cu_seqlens.ndim == 2:   # [1, S + 1] under pipeline parallelism
            cu_seqlens = cu_seqlens.squeeze(0)
        if isinstance(max_seqlen, torch.Tensor):
            max_seqlen = int(max_seqlen.item())
        check_positions(self.rope_cache, positions)
        h = self.tok_embeddings(tokens)
        attn_type = self._attn_type_for(h)
        for layer in self.layers.values():
            h = layer(h, self.rope_cache, positions, cu_seqlens, max_seqlen, attn_type)
        return self.output(self.norm(h))
