"""RoPE for Qwen3-MoE: modeling_qwen3_moe.py's Qwen3MoeRotaryEmbedding is Llama's, with the same
ROPE_INIT_FUNCTIONS and dynamic_rope_update (see gh_archon.llama.model.rope)."""

from gh_archon.llama.model.rope import (ROPE_TYPES, RopeArgs, RotaryEmbedding,
                                        apply_rotary_pos_emb, init_inv_freq, parse_rope,
                                        rotate_half)

__all__ = ["ROPE_TYPES", "RopeArgs", "RotaryEmbedding", "apply_rotary_pos_emb", "init_inv_freq",
           "parse_rope", "rotate_half"]
