"""Qwen3-MoE variants: 8 experts, top-2, with dense and sparse layers mixed both ways
(decoder_sparse_step 2; mlp_only_layers), norm_topk_prob true and false, tied and untied, one
sharded, and one with a 16-token sliding window (< the 300-token probe) and attention biases.

save_pretrained writes each expert's gate/up/down projection under its own key
(model.layers.L.mlp.experts.E.gate_proj.weight, ...), although transformers 5 holds them fused
as 3-D tensors; make_checkpoint draws those 3-D tensors with std 0.1 (its rule for tensors that
are not 2-D), which keeps expert outputs at unit scale, and the router [E, hidden] with std
hidden^-0.5, so routing is far from uniform. Upstream's default experts implementation
("grouped_mm") gives bit-identical logits to the eager loop on CPU for these models.
"""

from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from . import Variant, hub_pair

BASE = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,       # dense layers
    moe_intermediate_size=32,    # each expert
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    rope_theta=50000.0,  # deliberately not the 10000 default
    hidden_act="silu",
    num_experts=8,
    num_experts_per_tok=2,
    bos_token_id=1,
    eos_token_id=2,
)


def _v(**overrides):
    shard = overrides.pop("max_shard_size", None)
    return Variant("qwen3_moe", Qwen3MoeConfig, Qwen3MoeForCausalLM, {**BASE, **overrides}, shard)


VARIANTS = {
    # Layers 1 and 3 sparse, 0 and 2 dense; top-2 probabilities renormalised.
    "qwen3_moe-tiny-untied": _v(tie_word_embeddings=False, decoder_sparse_step=2,
                                norm_topk_prob=True),
    # Layer 0 dense through mlp_only_layers, 1..3 sparse; raw softmax probabilities.
    "qwen3_moe-tiny-tied": _v(tie_word_embeddings=True, decoder_sparse_step=1,
                              mlp_only_layers=[0], norm_topk_prob=False),
    # ~1.1 MB of fp32 weights in 300 KB shards: several shards plus an index.
    "qwen3_moe-tiny-sharded": _v(tie_word_embeddings=False, decoder_sparse_step=2,
                                 norm_topk_prob=True, max_shard_size="300KB"),
    # Sliding window 16 on every layer (only with use_sliding_window), q/k/v/o biases.
    "qwen3_moe-tiny-sliding": _v(tie_word_embeddings=False, decoder_sparse_step=1,
                                 norm_topk_prob=False, use_sliding_window=True,
                                 sliding_window=16, attention_bias=True),
    # 8 query heads over 4 KV heads, experts split 4 ways: a TP=4 fixture.
    "qwen3_moe-tiny-kv4": _v(tie_word_embeddings=False, num_attention_heads=8,
                             num_key_value_heads=4),
}


# Published config.json files (tools/refgen/hub_configs/SOURCES.md), sizes scaled down and
# every other field kept, as the Hub ships them (-hub) and as save_pretrained rewrites them
# (-saved).
# Qwen3-30B-A3B: every layer sparse (decoder_sparse_step 1, mlp_only_layers []),
# norm_topk_prob, router_aux_loss_coef, output_router_logits, max_window_layers.
VARIANTS.update(hub_pair(
    "qwen3_moe", Qwen3MoeConfig, Qwen3MoeForCausalLM,
    "qwen3_moe-real-qwen3-30b-a3b", "qwen3-30b-a3b.json",
    dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
         num_key_value_heads=2, vocab_size=256, head_dim=32, moe_intermediate_size=32,
         num_experts=8, num_experts_per_tok=2, bos_token_id=1, eos_token_id=2)))
