"""AReaL Archon's "sdpa" attention backend (areal/experimental/models/archon/attention/sdpa.py),
ported: torch's scaled_dot_product_attention over the packed row with an additive float mask
that is block-diagonal (one block per sequence of cu_seqlens) and causal inside each block,
0.0 where a key is seen and -inf elsewhere, in the queries' dtype; GQA through enable_gqa (no
repeated K/V); backends tried in AReaL's priority order (cuDNN, flash, memory-efficient, math).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

__all__ = ["SDPAWrapper", "block_causal_mask"]


def block_causal_mask(cu_seqlens: torch.Tensor, seq_len: int, device: torch.device,
                      dtype: torch.dtype) -> torch.Tensor:
    """[seq_len, seq_len] additive mask: query i sees key j when both lie in the same sequence
    of cu_seqlens and j <= i (0.0), nothing else (-inf). The sequence of each column is found
    by a right-sided search of cu_seqlens, as AReaL's create_block_causal_mask_2d does."""
    cols = torch.arange(seq_len, device=device)
    seq_of = torch.searchsorted(cu_seqlens.to(device), cols, side="right") - 1
    allowed = (seq_of[:, None] == seq_of[None, :]) & (cols[None, :] <= cols[:, None])
    mask = torch.full((seq_len, seq_len), float("-inf"), device=device, dtype=dtype)
    return mask.masked_fill(allowed, 0.0)


class SDPAWrapper(nn.Module):
    """q, k, v [B, H(_kv), T, D] -> [B, H, T, D]. Every row of the batch shares one mask (AReaL
    packs a batch into one row; for an unpacked batch cu_seqlens = [0, T] gives each row plain
    causal attention)."""

    BACKENDS = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                scale: float | None, cu_seqlens: torch.Tensor, max_seqlen: int | None
                ) -> torch.Tensor:
        mask = block_causal_mask(cu_seqlens, q.shape[2], q.device, q.dtype)
        with sdpa_kernel(self.BACKENDS, set_priority=True):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                                  is_causal=False,
                                                  enable_gqa=q.size(1) != k.size(1))
