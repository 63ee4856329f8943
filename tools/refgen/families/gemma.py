"""Gemma variants: tied (the Gemma default), untied, sharded, and attention_bias.

hidden_size is 16, not the 64 of the other families: Gemma multiplies the embeddings by
sqrt(hidden_size), and with make_checkpoint's N(0, 0.5) embeddings at hidden 64 the scaled input
embedding dominates the residual stream, so a tied model predicts its input token with
probability ~1 (entropy 0) and KL is blind to RoPE bugs (rope_theta 10000 instead of 50000 gave
KL 2e-8). At hidden 16 the tied model's entropy is ~3 nats and the same bug gives KL 1e-2.
head_dim 32 is not hidden_size / num_attention_heads (4); q/k/v are wider than the hidden state,
as in gemma-7b (16 x 256 > 3072). Norm weights are drawn around 0 (norm_offset_one): Gemma norms
compute x * (1 + w)."""

from transformers import GemmaConfig, GemmaForCausalLM

from . import Variant, hub_pair

BASE = dict(
    vocab_size=256,
    hidden_size=16,  # see the module docstring
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    rope_theta=50000.0,  # deliberately not the 10000 default
    hidden_act="gelu_pytorch_tanh",
    pad_token_id=0,
    bos_token_id=2,
    eos_token_id=1,
)


def _v(**overrides):
    shard = overrides.pop("max_shard_size", None)
    return Variant("gemma", GemmaConfig, GemmaForCausalLM, {**BASE, **overrides}, shard,
                   norm_offset_one=True)


VARIANTS = {
    "gemma-tiny-tied": _v(tie_word_embeddings=True),
    "gemma-tiny-untied": _v(tie_word_embeddings=False),
    # ~90 KB of fp32 weights in 30 KB shards: several shards plus an index.
    "gemma-tiny-sharded": _v(tie_word_embeddings=True, max_shard_size="30KB"),
    # q/k/v/o biases (GemmaAttention honours attention_bias).
    "gemma-tiny-attn-bias": _v(tie_word_embeddings=False, attention_bias=True),
}


# Published config.json files (tools/refgen/hub_configs/SOURCES.md), sizes scaled down and
# every other field kept, as the Hub ships them (-hub) and as save_pretrained rewrites them
# (-saved).
# gemma-2b-it: the legacy hidden_act "gelu", multi-query attention, rope_scaling null,
# _name_or_path.
VARIANTS.update(hub_pair(
    "gemma", GemmaConfig, GemmaForCausalLM, "gemma-real-gemma-2b-it", "gemma-2b-it.json",
    dict(hidden_size=16, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
         num_key_value_heads=1, head_dim=32, vocab_size=256)))
