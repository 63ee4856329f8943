"""Qwen3's RoPE is Qwen2's (gh_areal.qwen2.model.rope), as in Archon."""

from gh_areal.qwen2.model.rope import (apply_rotary_emb, check_positions, precompute_rope_cache,
                                       rotate_half)

__all__ = ["apply_rotary_emb", "check_positions", "precompute_rope_cache", "rotate_half"]
