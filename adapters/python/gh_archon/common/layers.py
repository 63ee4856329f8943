"""Decoder building blocks shared by the llama and qwen3_moe adapters, written op for op as
transformers' eager path computes them (modeling_llama.py / modeling_qwen3_moe.py, 5.24), under
Archon's / torchtitan's names (wq/wk/wv/wo, w1/w2/w3, attention_norm, ffn_norm).

Packed sequences (cu_seqlens) are computed per sequence where the op mixes tokens (attention,
RoPE tables), on slices with the layout upstream has for an unpacked sequence, so each packed
sequence sees the same kernels as upstream on that sequence alone; the token-wise GEMMs run over
the whole packed row.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from gatehouse_adapter.frameworks._common import check_rows
from gh_archon.common.kv_cache import KVCache, cached_mask
from gh_archon.llama.model.rope import apply_rotary_pos_emb

ACTIVATIONS = ("silu", "swish")  # transformers' ACT2FN: SiLUActivation / nn.SiLU, both F.silu


def act_fn(name: str):
    if name in ACTIVATIONS:
        return F.silu
    raise ValueError(f"unsupported activation {name!r}")


class RMSNorm(nn.Module):
    """LlamaRMSNorm / Qwen3MoeRMSNorm: fp32 variance, rsqrt(var + eps), cast back, then weight *."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.eps)
        return self.weight * hidden_states.to(input_dtype)


class FeedForward(nn.Module):
    """SwiGLU MLP: w2(act(w1(x)) * w3(x)); w1 = gate_proj, w3 = up_proj, w2 = down_proj."""

    def __init__(self, dim: int, hidden_dim: int, bias: bool, act: str,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=bias, dtype=dtype)
        self.w2 = nn.Linear(hidden_dim, dim, bias=bias, dtype=dtype)
        self.w3 = nn.Linear(dim, hidden_dim, bias=bias, dtype=dtype)
        self.act = act_fn(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.act(self.w1(x)) * self.w3(x))


def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, n_kv, T, D] -> [B, n_kv * n_rep, T, D], upstream's expand + reshape."""
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def causal_mask(length: int, sliding_window: int | None, dtype: torch.dtype,
                device: torch.device) -> torch.Tensor:
    """[T, T] additive mask as transformers' eager_mask makes it: 0 where key kv may be seen by
    query q (kv <= q, and kv > q - sliding_window with a window), dtype's min elsewhere; the
    cached forward's mask over an empty cache (kv_cache.py)."""
    return cached_mask(0, length, 0, sliding_window, dtype, device)


def eager_attention(query, key, value, mask, n_rep: int, scaling: float) -> torch.Tensor:
    """eager_attention_forward: q [B, H, T, D], k/v [B, H_kv, T, D] -> [B, T, H, D] contiguous."""
    key_states = repeat_kv(key, n_rep)
    value_states = repeat_kv(value, n_rep)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    attn_weights = attn_weights + mask
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_output = torch.matmul(attn_weights, value_states)
    return attn_output.transpose(1, 2).contiguous()


class Attention(nn.Module):
    """Multi-head attention with GQA, optional q/k RMSNorm per head (Qwen3) and sliding window.

    Under tensor parallelism wq/wk/wv are column-sharded and wo row-sharded: the head counts are
    taken from the projections' local output sizes (views use -1 heads), so n_heads / n_kv_heads
    are per-rank automatically; n_rep is unchanged.
    """

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, bias: bool,
                 qk_norm: bool, norm_eps: float, sliding_window: int | None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        if n_heads % n_kv_heads:
            raise ValueError(f"num_attention_heads {n_heads} is not a multiple of "
                             f"num_key_value_heads {n_kv_heads}")
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.n_rep = n_heads // n_kv_heads
        self.head_dim = head_dim
        self.scaling = head_dim ** -0.5
        self.sliding_window = sliding_window
        self.wq = nn.Linear(dim, n_heads * head_dim, bias=bias, dtype=dtype)
        self.wk = nn.Linear(dim, n_kv_heads * head_dim, bias=bias, dtype=dtype)
        self.wv = nn.Linear(dim, n_kv_heads * head_dim, bias=bias, dtype=dtype)
        self.wo = nn.Linear(n_heads * head_dim, dim, bias=bias, dtype=dtype)
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, norm_eps, dtype=dtype)
            self.k_norm = RMSNorm(head_dim, norm_eps, dtype=dtype)
        else:
            self.q_norm = None
            self.k_norm = None

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, dim] -> q [B, heads, T, head_dim], k and v [B, kv_heads, T, head_dim]:
        projected and, with q/k norms (Qwen3), normed per head; RoPE not yet applied."""
        bsz, seqlen, _ = x.shape
        hidden_shape = (bsz, seqlen, -1, self.head_dim)
        q = self.wq(x).view(hidden_shape)
        k = self.wk(x).view(hidden_shape)
        v = self.wv(x).view(hidden_shape)
        if self.q_norm is not None:
            q = self.q_norm(q)
            k = self.k_norm(k)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                segments: Sequence[tuple[int, int]] | None) -> torch.Tensor:
        bsz, seqlen, _ = x.shape
        q, k, v = self._qkv(x)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if segments is None:
            mask = causal_mask(seqlen, self.sliding_window, q.dtype, q.device)
            out = eager_attention(q, k, v, mask, self.n_rep, self.scaling)
        else:
            outs = []
            for a, b in segments:
                mask = causal_mask(b - a, self.sliding_window, q.dtype, q.device)
                outs.append(eager_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], mask,
                                            self.n_rep, self.scaling))
            out = torch.cat(outs, dim=1)
        out = out.reshape(bsz, seqlen, -1).contiguous()
        return self.wo(out)

    def forward_cached(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       cache: KVCache, layer: int) -> torch.Tensor:
        """forward for T new positions after ``cache.length`` cached ones (kv_cache.py): x
        [B, T, dim], cos/sin [B, T, head_dim] of the new positions; the new keys (after RoPE)
        and values are written to ``cache`` under ``layer`` and attention covers the cached
        keys too (within the sliding window). The caller advances ``cache.length``."""
        bsz, seqlen, _ = x.shape
        q, k, v = self._qkv(x)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        start = cache.length
        window = self.sliding_window
        keys, values, first = cache.update(layer, k, v, window)
        mask = cached_mask(start, seqlen, first, window, q.dtype, q.device)
        out = eager_attention(q, keys, values, mask, self.n_rep, self.scaling)
        out = out.reshape(bsz, seqlen, -1).contiguous()
        return self.wo(out)


def segments_from_cu_seqlens(tokens: torch.Tensor, positions: torch.Tensor,
                             cu_seqlens: torch.Tensor | None) -> list[tuple[int, int]] | None:
    """Validates the forward's inputs; [(start, end)] per packed sequence, or None unpacked."""
    cu = check_rows(tokens, positions, cu_seqlens)
    return None if cu is None else list(zip(cu[:-1], cu[1:]))


def rope_tables(rope, positions: torch.Tensor, segments, dtype: torch.dtype):
    """cos, sin [B, T, D]: per packed sequence (its own positions, its own dynamic-RoPE length,
    the same elementwise kernels as for that sequence alone), else for the whole batch."""
    if segments is None:
        return rope(positions, dtype)
    parts = [rope(positions[:, a:b], dtype) for a, b in segments]
    return (torch.cat([c for c, _ in parts], dim=1), torch.cat([s for _, s in parts], dim=1))
