"""Mistral variants: tied, untied, sharded, head_dim unlike hidden / heads, and full attention
(sliding_window null); the default variants slide over 16 keys on every layer, far less than
the 300-token probe, so a mask mistake shows.

MistralModel uses create_sliding_window_causal_mask for every layer when config.sliding_window
is set and create_causal_mask when it is null (modeling_mistral.py).
"""

from transformers import MistralConfig, MistralForCausalLM

from . import TINY_BASE, Variant, hub_pair

BASE = dict(TINY_BASE, sliding_window=16)


def _v(**overrides):
    shard = overrides.pop("max_shard_size", None)
    return Variant("mistral", MistralConfig, MistralForCausalLM, {**BASE, **overrides}, shard)


VARIANTS = {
    "mistral-tiny-tied": _v(tie_word_embeddings=True),
    "mistral-tiny-untied": _v(tie_word_embeddings=False),
    "mistral-tiny-sharded": _v(tie_word_embeddings=False, max_shard_size="100KB"),
    # sliding_window null: full causal attention on every layer.
    "mistral-tiny-full": _v(tie_word_embeddings=False, sliding_window=None),
    # head_dim 32 with hidden 64 and 4 heads (Mistral-Nemo style: not hidden / heads).
    "mistral-tiny-headdim": _v(tie_word_embeddings=True, head_dim=32),
}


# Published config.json files (tools/refgen/hub_configs/SOURCES.md), sizes scaled down and
# every other field kept, as the Hub ships them (-hub) and as save_pretrained rewrites them
# (-saved).
# Mistral-7B-v0.1: every layer slides; the window (4096 there) scaled to 16 < the 300-token
# probe so that it acts; head_dim absent (derived).
VARIANTS.update(hub_pair(
    "mistral", MistralConfig, MistralForCausalLM,
    "mistral-real-mistral-7b-v0.1", "mistral-7b-v0.1.json",
    dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
         num_key_value_heads=2, vocab_size=256, sliding_window=16)))
