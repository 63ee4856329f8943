"""Gatehouse SPEC for Archon's dense Qwen3 (gh_areal.qwen3), through the Archon shim."""

from gatehouse_adapter import Fields
from gatehouse_adapter.frameworks import archon
from gh_areal.qwen3 import QWEN3_SPEC

FIELDS = Fields(
    sizes=("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
           "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"),
    numbers=("rms_norm_eps",),
    flags=("tie_word_embeddings",),
    only={"hidden_act": (("silu", "swish"), "Archon's FeedForward is SwiGLU with F.silu only"),
          "attention_bias": ((False,), "Archon's Qwen3 projections have no bias"),
          "qk_norm": ((True,), "transformers' Qwen3 always applies q_norm / k_norm"),
          "pad_token_id": ((), "Archon's embedding has no padding row (transformers' keeps "
                               "its gradient at zero)"),
          "use_sliding_window": ((False,), "Archon's attention has no sliding window"),
          "layer_types[]": (("full_attention",), "Archon attends causally in every layer")},
    divides=(("num_key_value_heads", "num_attention_heads"),),
    rope_types=("default",),
    ignored={"sliding_window": "used only with use_sliding_window, which is false here",
             "max_window_layers": "chooses sliding layers, which exist only with "
                                  "use_sliding_window (false here)"},
)

SPEC = archon.model_spec(QWEN3_SPEC, fields=FIELDS)
