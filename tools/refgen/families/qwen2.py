"""Qwen2 variants: tied, untied, sharded, and sliding-window configs whose 300-token probe runs
far past the window, where a mask mistake shows.

Qwen2 always has q/k/v biases (no o_proj bias); make_checkpoint draws them N(0, 0.1) so a
dropped bias changes the logits. Qwen2Config.__post_init__ sets sliding_window to None unless
use_sliding_window, and derives layer_types: "sliding_attention" for layers i >=
max_window_layers when sliding is on (configuration_qwen2.py); save_pretrained writes the derived
layer_types into config.json.
"""

from transformers import Qwen2Config, Qwen2ForCausalLM

from . import TINY_BASE, Variant, hub_pair

BASE = dict(TINY_BASE)


def _v(**overrides):
    shard = overrides.pop("max_shard_size", None)
    return Variant("qwen2", Qwen2Config, Qwen2ForCausalLM, {**BASE, **overrides}, shard)


VARIANTS = {
    "qwen2-tiny-tied": _v(tie_word_embeddings=True),
    "qwen2-tiny-untied": _v(tie_word_embeddings=False),
    "qwen2-tiny-sharded": _v(tie_word_embeddings=False, max_shard_size="100KB"),
    # 3 layers, max_window_layers 1: layer 0 full attention, layers 1 and 2 slide over 16 keys.
    "qwen2-tiny-sliding": _v(tie_word_embeddings=False, num_hidden_layers=3,
                             use_sliding_window=True, sliding_window=16, max_window_layers=1),
    # Sliding window configured but switched off (use_sliding_window false): full attention
    # everywhere, although sliding_window and max_window_layers are set.
    "qwen2-tiny-sliding-off": _v(tie_word_embeddings=True, num_hidden_layers=3,
                                 use_sliding_window=False, sliding_window=16,
                                 max_window_layers=1),
}


# Published config.json files (tools/refgen/hub_configs/SOURCES.md), sizes scaled down and
# every other field kept, as the Hub ships them (-hub) and as save_pretrained rewrites them
# (-saved).
# Qwen2.5-0.5B-Instruct: use_sliding_window false beside a sliding_window and max_window_layers.
VARIANTS.update(hub_pair(
    "qwen2", Qwen2Config, Qwen2ForCausalLM,
    "qwen2-real-qwen2.5-0.5b-instruct", "qwen2.5-0.5b-instruct.json",
    dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
         num_key_value_heads=2, vocab_size=256, bos_token_id=1, eos_token_id=2)))
# Qwen2.5-0.5B (base): also use_mrope, which the Qwen2 text model never reads.
VARIANTS.update(hub_pair(
    "qwen2", Qwen2Config, Qwen2ForCausalLM, "qwen2-real-qwen2.5-0.5b", "qwen2.5-0.5b.json",
    dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
         num_key_value_heads=2, vocab_size=256, bos_token_id=1, eos_token_id=1)))
