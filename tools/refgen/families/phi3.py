"""Phi-3 variants: fused qkv_proj and gate_up_proj, partial rotary (factor 0.5 and 0.75),
tied and untied, one sharded, one with a 16-token sliding window (< the 300-token probe)."""

from transformers import Phi3Config, Phi3ForCausalLM

from . import Variant, hub_pair

BASE = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    hidden_act="silu",
    bos_token_id=1,
    # No eos id in the config (make_checkpoint's greedy ignores eos either way: it runs exactly
    # 32 plain argmax steps); kept so the saved fixtures stay as they are.
    eos_token_id=None,
    pad_token_id=0,  # Phi3Config's default 32000 lies outside this tiny vocabulary
)


def _rope(partial_rotary_factor):
    # rope_theta deliberately not the 10000 default.
    return {"rope_type": "default", "rope_theta": 50000.0,
            "partial_rotary_factor": partial_rotary_factor}


def _v(**overrides):
    shard = overrides.pop("max_shard_size", None)
    return Variant("phi3", Phi3Config, Phi3ForCausalLM, {**BASE, **overrides}, shard)


VARIANTS = {
    # Half of each head's 16 channels rotated.
    "phi3-tiny-untied": _v(tie_word_embeddings=False, rope_parameters=_rope(0.5)),
    "phi3-tiny-tied": _v(tie_word_embeddings=True, rope_parameters=_rope(1.0)),
    # ~330 KB of fp32 weights in 100 KB shards: several shards plus an index.
    "phi3-tiny-sharded": _v(tie_word_embeddings=False, rope_parameters=_rope(0.5),
                            max_shard_size="100KB"),
    "phi3-tiny-sliding": _v(tie_word_embeddings=False, rope_parameters=_rope(0.75),
                            sliding_window=16),
    # 8 query heads over 4 KV heads in the fused qkv_proj: a TP=4 fixture.
    "phi3-tiny-kv4": _v(tie_word_embeddings=False, num_attention_heads=8, num_key_value_heads=4),
}


# Published config.json files (tools/refgen/hub_configs/SOURCES.md), sizes scaled down and
# every other field kept, as the Hub ships them (-hub) and as save_pretrained rewrites them
# (-saved).
# Phi-3-mini-4k-instruct: attention_bias (Phi3 never reads it), embd_pdrop, resid_pdrop,
# auto_map, original_max_position_embeddings; pad/eos 32000 scaled to 2 (the padding row
# must exist, and the probe prompts leave ids 0..2 out).
VARIANTS.update(hub_pair(
    "phi3", Phi3Config, Phi3ForCausalLM,
    "phi3-real-phi-3-mini-4k-instruct", "phi-3-mini-4k-instruct.json",
    dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
         num_key_value_heads=4, vocab_size=256, bos_token_id=1, eos_token_id=2, pad_token_id=2,
         sliding_window=16)))
