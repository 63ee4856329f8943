"""Gemma 3 text variants (Gemma3ForCausalLM): tied (the default), untied, sharded, and an explicit
layer_types list with linear RoPE scaling on the full-attention layers (as the 4B+ models).

The default-pattern variants have 7 layers: 5 sliding, 1 full, 1 sliding. Local and global
rope_theta differ from each other and from the config defaults; windows (16) are shorter than
the 300-token probe; final soft-capping (3.0) bites. attn_logit_softcapping (2.0) is set
although upstream's Gemma3Attention never applies it: the fixtures prove the adaptation does
not either. hidden_size is 16 for the reason given in gemma.py."""

from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from . import Variant, hub_pair

BASE = dict(
    vocab_size=256,
    hidden_size=16,  # see the module docstring (gemma.py)
    intermediate_size=64,
    num_hidden_layers=7,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    hidden_activation="gelu_pytorch_tanh",
    query_pre_attn_scalar=24,
    sliding_window=16,
    attn_logit_softcapping=2.0,
    final_logit_softcapping=3.0,
    pad_token_id=0,
    bos_token_id=2,
    eos_token_id=1,
)


def _ropes(full=None):
    # Complete dicts: convert_rope_params_to_dict would otherwise fill them in place.
    return {
        "full_attention": full or {"rope_type": "default", "rope_theta": 200000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0},
    }


def _v(**overrides):
    shard = overrides.pop("max_shard_size", None)
    config = {**BASE, "rope_parameters": _ropes(overrides.pop("full_rope", None)), **overrides}
    return Variant("gemma3", Gemma3TextConfig, Gemma3ForCausalLM, config, shard,
                   norm_offset_one=True)


VARIANTS = {
    "gemma3-tiny-tied": _v(tie_word_embeddings=True),
    "gemma3-tiny-untied": _v(tie_word_embeddings=False),
    # ~280 KB of fp32 weights in 80 KB shards.
    "gemma3-tiny-sharded": _v(tie_word_embeddings=True, max_shard_size="80KB"),
    "gemma3-tiny-layer-types": _v(
        tie_word_embeddings=False,
        num_hidden_layers=4,
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        full_rope={"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0}),
}


# Published config.json files (tools/refgen/hub_configs/SOURCES.md), sizes scaled down and
# every other field kept, as the Hub ships them (-hub) and as save_pretrained rewrites them
# (-saved).
# gemma-3-1b-it: the legacy sliding_window_pattern 6 and rope_local_base_freq (no
# layer_types, no rope_parameters); seven layers: five local, one global, one local.
VARIANTS.update(hub_pair(
    "gemma3", Gemma3TextConfig, Gemma3ForCausalLM,
    "gemma3-real-gemma-3-1b-it", "gemma-3-1b-it.json",
    dict(hidden_size=16, intermediate_size=64, num_hidden_layers=7, num_attention_heads=4,
         num_key_value_heads=1, head_dim=32, vocab_size=256, sliding_window=16)))
