"""AReaL Archon's "varlen" attention backend, its default (ArchonEngineConfig.attn_type),
ported from areal/experimental/models/archon/attention/varlen.py: PyTorch's bundled
flash-attention varlen kernels (aten._flash_attention_forward / _backward) over the packed row
as [total_tokens, heads, head_dim], causal inside each sequence of cu_seqlens (int32), no
dropout, K/V with their own (fewer) heads (flash attention's native GQA).

AReaL registers the pair as a torch.library custom op with an autograd formula; an
autograd.Function calls the same kernels with the same arguments here. The kernels run on CUDA
in fp16 / bf16 only (``available``); the model falls back to the sdpa backend elsewhere.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["VarlenAttentionWrapper", "available", "varlen_attn"]


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the flash varlen kernels can run for tensors of this device and dtype."""
    return device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)


class _VarlenFlash(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, max_seqlen: int, scale: float | None):
        out, lse, rng_state, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, 0.0, True, False,
            scale=scale)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens, rng_state, unused)
        ctx.max_seqlen, ctx.scale = max_seqlen, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, cu_seqlens, rng_state, unused = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            grad_out.contiguous(), q, k, v, out, lse, cu_seqlens, cu_seqlens, ctx.max_seqlen,
            ctx.max_seqlen, 0.0, True, rng_state, unused, scale=ctx.scale)
        return dq, dk, dv, None, None, None


def varlen_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                max_seqlen: int, scale: float | None = None) -> torch.Tensor:
    """q [T, H, D], k / v [T, H_kv, D], cu_seqlens int32 [S + 1] -> [T, H, D] (causal per
    sequence)."""
    return _VarlenFlash.apply(q, k, v, cu_seqlens, max_seqlen, scale)


class VarlenAttentionWrapper(nn.Module):
    """q, k, v [1, H(_kv), T, D] -> [1, H, T, D], as AReaL's wrapper: the batch must be one
    packed row."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                scale: float | None, cu_seqlens: torch.Tensor, max_seqlen: int | None
                ) -> torch.Tensor:
        if q.shape[0] != 1:
            raise ValueError(f"varlen attention takes one packed row, got a batch of {q.shape[0]}")
        cu = cu_seqlens.to(device=q.device, dtype=torch.int32)
        if max_seqlen is None:
            max_seqlen = int((cu[1:] - cu[:-1]).max().item())
        q3 = q.squeeze(0).transpose(0, 1).contiguous()
        k3 = k.squeeze(0).transpose(0, 1).contiguous()
        v3 = v.squeeze(0).transpose(0, 1).contiguous()
        out = varlen_attn(q3, k3, v3, cu, int(max_seqlen), scale)
        return out.transpose(0, 1).unsqueeze(0)
