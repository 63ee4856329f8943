"""AReaL Archon's attention backends: "varlen" (its default: flash attention over the packed
row) and "sdpa" (scaled_dot_product_attention with a block-diagonal causal mask)."""

from gh_areal.attention.sdpa import SDPAWrapper, block_causal_mask
from gh_areal.attention.varlen import VarlenAttentionWrapper, available as varlen_available

__all__ = ["SDPAWrapper", "VarlenAttentionWrapper", "block_causal_mask", "varlen_available"]
