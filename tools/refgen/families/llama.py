"""Llama variants: tied, untied, sharded, and RoPE-scaled (linear, dynamic, llama3) configs whose
long probe (300 tokens) runs past the scaling threshold, where RoPE mistakes show."""

from transformers import LlamaConfig, LlamaForCausalLM

from . import TINY_BASE, Variant, hub_pair

BASE = dict(TINY_BASE)


def _v(**overrides):
    shard = overrides.pop("max_shard_size", None)
    return Variant("llama", LlamaConfig, LlamaForCausalLM, {**BASE, **overrides}, shard)


VARIANTS = {
    "llama-tiny-tied": _v(tie_word_embeddings=True),
    "llama-tiny-untied": _v(tie_word_embeddings=False),
    # ~440 KB of fp32 weights in 100 KB shards: several shards and an index file.
    "llama-tiny-sharded": _v(tie_word_embeddings=False, max_shard_size="100KB"),
    # llama3 scaling with original_max_position_embeddings 64 < the 300-token probe.
    "llama-tiny-rope-llama3": _v(
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64}),
    "llama-tiny-rope-linear": _v(
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "linear", "rope_theta": 50000.0, "factor": 4.0}),
    # dynamic NTK grows the base once positions pass max_position_embeddings (128 < 300).
    "llama-tiny-rope-dynamic": _v(
        tie_word_embeddings=False, max_position_embeddings=128,
        rope_parameters={"rope_type": "dynamic", "rope_theta": 50000.0, "factor": 2.0}),
    # 8 query heads over 4 KV heads: TP=4 divides both (the parallel gate's TP=4 fixture).
    "llama-tiny-kv4": _v(tie_word_embeddings=False, num_attention_heads=8, num_key_value_heads=4),
}


# Published config.json files (tools/refgen/hub_configs/SOURCES.md), sizes scaled down and
# every other field kept, as the Hub ships them (-hub) and as save_pretrained rewrites them
# (-saved).
# Llama 3.2 1B: llama3 rope_scaling (original_max_position_embeddings 8192 scales the low
# frequencies), tied, head_dim given.
VARIANTS.update(hub_pair(
    "llama", LlamaConfig, LlamaForCausalLM, "llama-real-llama3.2-1b", "llama3.2-1b.json",
    dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
         num_key_value_heads=2, vocab_size=256, head_dim=16, bos_token_id=1, eos_token_id=2)))
# SmolLM2-135M: is_llama_config and rope_interleaved (fields LlamaConfig does not define),
# 3 heads over 1 KV head, head_dim derived (48 / 3), an integer rope_theta.
VARIANTS.update(hub_pair(
    "llama", LlamaConfig, LlamaForCausalLM, "llama-real-smollm2-135m", "smollm2-135m.json",
    dict(hidden_size=48, intermediate_size=128, num_hidden_layers=2, num_attention_heads=3,
         num_key_value_heads=1, vocab_size=256)))
