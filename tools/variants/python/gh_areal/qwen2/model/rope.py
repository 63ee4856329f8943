"""RoPE as AReaL's Archon computes it (areal/experimental/models/archon/qwen2/model/rope.py,
which its qwen3 imports; from torchtitan's qwen3):

* one fp32 cache [max_seq_len, 2 * head_dim] built once per device: inv_freq =
  1 / theta^(2i / d), angles = outer(positions 0..max_seq_len-1, inv_freq), duplicated to the
  full head (rotate-half layout), cos in the first half of the row and sin in the second;
* per forward, the rows of the tokens' positions gathered from it, cos / sin cast to the
  activations' dtype, and q / k rotated by rotate_half in their [B, T, H, D] layout, before the
  heads are transposed for attention (transformers rotates after the transpose, from cos / sin
  it computes per call).
"""

from __future__ import annotations

import torch


def precompute_rope_cache(dim: int, max_seq_len: int, base=10000.0) -> torch.Tensor:
    """[max_seq_len, 2 * dim] fp32: cos | sin of the angles, on the current default device."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    t = torch.arange(max_seq_len, dtype=inv_freq.dtype, device=inv_freq.device)
    angles = torch.outer(t, inv_freq).float()
    angles = torch.cat([angles, angles], dim=-1)
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_rows(rope_cache: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The cache rows of positions [B, T] as [B, T, 1, 2 * head_dim] (a plain gather, as
    AReaL's reshape_for_broadcast)."""
    return rope_cache[positions].unsqueeze(2)


def check_positions(rope_cache: torch.Tensor, positions: torch.Tensor) -> None:
    """AReaL's cache has max_position_embeddings rows; a position past them has no row (AReaL
    would index out of range): refused."""
    if positions.numel() and (int(positions.min()) < 0
                              or int(positions.max()) >= rope_cache.shape[0]):
        raise ValueError(f"positions in [{int(positions.min())}, {int(positions.max())}] "
                         f"exceed the RoPE cache of max_position_embeddings = "
                         f"{rope_cache.shape[0]} rows (AReaL precomputes no more)")


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, rope_cache: torch.Tensor,
                     positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """xq [B, T, H, D], xk [B, T, H_kv, D] -> rotated, same shapes and dtype."""
    head_dim = xq.shape[-1]
    rows = rope_rows(rope_cache, positions)
    cos = rows[..., :head_dim].to(dtype=xq.dtype, device=xq.device)
    sin = rows[..., head_dim:].to(dtype=xq.dtype, device=xq.device)
    xq_out = (xq * cos) + (rotate_half(xq) * sin)
    xk_out = (xk * cos) + (rotate_half(xk) * sin)
    return xq_out.type_as(xq), xk_out.type_as(xk)
