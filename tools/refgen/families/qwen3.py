"""Qwen3 variants: tied, untied, sharded, attention_bias, and a sliding-window config whose
300-token probe runs far past the window.

Qwen3 normalises q and k per head over head_dim (q_norm / k_norm, RMSNorm) before RoPE, and its
head_dim is its own field: here 32 with hidden 64 and 4 heads (not hidden / heads = 16), so
using the derived head_dim breaks shapes. Sliding-window flags work as in Qwen2
(configuration_qwen3.py).
"""

from transformers import Qwen3Config, Qwen3ForCausalLM

from . import TINY_BASE, Variant, hub_pair

BASE = dict(TINY_BASE, head_dim=32)  # head_dim != hidden_size / num_attention_heads


def _v(seed=None, **overrides):
    shard = overrides.pop("max_shard_size", None)
    return Variant("qwen3", Qwen3Config, Qwen3ForCausalLM, {**BASE, **overrides}, shard,
                   seed=seed)


VARIANTS = {
    "qwen3-tiny-tied": _v(tie_word_embeddings=True),
    "qwen3-tiny-untied": _v(tie_word_embeddings=False),
    "qwen3-tiny-sharded": _v(tie_word_embeddings=False, max_shard_size="100KB"),
    # q/k/v/o biases. Seed 2: the default seed's 300-token prompt decodes two tokens in turn.
    "qwen3-tiny-bias": _v(tie_word_embeddings=True, attention_bias=True, seed=2),
    # 3 layers, max_window_layers 1: layer 0 full, layers 1 and 2 slide over 32 keys.
    "qwen3-tiny-sliding": _v(tie_word_embeddings=False, num_hidden_layers=3,
                             use_sliding_window=True, sliding_window=32, max_window_layers=1),
    # 8 query heads over 4 KV heads with q_norm / k_norm, tied: a TP=4 fixture.
    "qwen3-tiny-kv4": _v(tie_word_embeddings=True, num_attention_heads=8, num_key_value_heads=4),
}


# Published config.json files (tools/refgen/hub_configs/SOURCES.md), sizes scaled down and
# every other field kept, as the Hub ships them (-hub) and as save_pretrained rewrites them
# (-saved).
# Qwen3-0.6B: head_dim (32) != hidden_size / num_attention_heads (16), as 128 != 64 there;
# sliding_window null, max_window_layers, an integer rope_theta.
VARIANTS.update(hub_pair(
    "qwen3", Qwen3Config, Qwen3ForCausalLM, "qwen3-real-qwen3-0.6b", "qwen3-0.6b.json",
    dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
         num_key_value_heads=2, vocab_size=256, head_dim=32, bos_token_id=1, eos_token_id=2)))
