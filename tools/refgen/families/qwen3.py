"""Qwen3 variants: tied, untied, sharded, attention_bias, and a sliding-window config whose
300-token probe runs far past the window.

Qwen3 normalises q and k per head over head_dim (q_norm / k_norm, RMSNorm) before RoPE, and its
head_dim is its own field: here 32 with hidden 64 and 4 heads (not hidden / heads = 16), so
using the derived head_dim breaks shapes. Sliding-window flags work as in Qwen2
(configuration_qwen3.py).
"""

from transformers import Qwen3Config, Qwen3ForCausalLM

from . import TINY_BASE, Variant

BASE = dict(TINY_BASE, head_dim=32)  # head_dim != hidden_size / num_attention_heads


def _v(**overrides):
    shard = overrides.pop("max_shard_size", None)
    return Variant("qwen3", Qwen3Config, Qwen3ForCausalLM, {**BASE, **overrides}, shard)


VARIANTS = {
    "qwen3-tiny-tied": _v(tie_word_embeddings=True),
    "qwen3-tiny-untied": _v(tie_word_embeddings=False),
    "qwen3-tiny-sharded": _v(tie_word_embeddings=False, max_shard_size="100KB"),
    # q/k/v/o biases.
    "qwen3-tiny-bias": _v(tie_word_embeddings=True, attention_bias=True),
    # 3 layers, max_window_layers 1: layer 0 full, layers 1 and 2 slide over 32 keys.
    "qwen3-tiny-sliding": _v(tie_word_embeddings=False, num_hidden_layers=3,
                             use_sliding_window=True, sliding_window=32, max_window_layers=1),
    # 8 query heads over 4 KV heads with q_norm / k_norm, tied: a TP=4 fixture.
    "qwen3-tiny-kv4": _v(tie_word_embeddings=True, num_attention_heads=8, num_key_value_heads=4),
}
