"""Gemma 2 variants: tied (the default), untied, sharded, soft-capping off, and an explicit
layer_types list.

Windows (16) are shorter than the 300-token probe, so sliding layers differ from full ones.
Soft-capping values bite: final 3.0 against raw logits up to ~11 (tied), attention 2.0 against
scores beyond it. query_pre_attn_scalar (24) differs from head_dim (32), which differs from
hidden_size / num_attention_heads (4). hidden_size is 16 for the reason given in gemma.py (the
sqrt(hidden_size) embedding scale makes hidden-64 tied models copy their input token)."""

from transformers import Gemma2Config, Gemma2ForCausalLM

from . import Variant, hub_pair

BASE = dict(
    vocab_size=256,
    hidden_size=16,  # see the module docstring (gemma.py)
    intermediate_size=64,
    num_hidden_layers=4,  # sliding, full, sliding, full (Gemma2Config's default pattern)
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    rope_theta=50000.0,
    hidden_activation="gelu_pytorch_tanh",
    query_pre_attn_scalar=24,
    sliding_window=16,
    attn_logit_softcapping=2.0,
    final_logit_softcapping=3.0,
    pad_token_id=0,
    bos_token_id=2,
    eos_token_id=1,
)


def _v(**overrides):
    shard = overrides.pop("max_shard_size", None)
    return Variant("gemma2", Gemma2Config, Gemma2ForCausalLM, {**BASE, **overrides}, shard,
                   norm_offset_one=True)


VARIANTS = {
    "gemma2-tiny-tied": _v(tie_word_embeddings=True),
    "gemma2-tiny-untied": _v(tie_word_embeddings=False),
    # ~170 KB of fp32 weights in 50 KB shards.
    "gemma2-tiny-sharded": _v(tie_word_embeddings=False, max_shard_size="50KB"),
    # Explicit nulls: no capping at all (an absent field would mean the 50 / 30 defaults).
    "gemma2-tiny-nocap": _v(tie_word_embeddings=True, attn_logit_softcapping=None,
                            final_logit_softcapping=None),
    # A layer_types list that is not the default alternation.
    "gemma2-tiny-layer-types": _v(
        tie_word_embeddings=True,
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"]),
    # 8 query heads over 4 KV heads, soft-capping, tied: a TP=4 fixture.
    "gemma2-tiny-kv4": _v(tie_word_embeddings=True, num_attention_heads=8, num_key_value_heads=4),
}


# Published config.json files (tools/refgen/hub_configs/SOURCES.md), sizes scaled down and
# every other field kept, as the Hub ships them (-hub) and as save_pretrained rewrites them
# (-saved).
# gemma-2-2b: both hidden_act and hidden_activation, cache_implementation, soft-capping
# 50 / 30, query_pre_attn_scalar 256; four layers: sliding, full, sliding, full.
VARIANTS.update(hub_pair(
    "gemma2", Gemma2Config, Gemma2ForCausalLM, "gemma2-real-gemma-2-2b", "gemma-2-2b.json",
    dict(hidden_size=16, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
         num_key_value_heads=2, head_dim=32, vocab_size=256, sliding_window=16)))
