"""Gatehouse SPEC for Qwen3 (dense) as torchtitan writes it (gh_titan.qwen3), through the
torchtitan shim."""

from gatehouse_adapter import Fields
from gatehouse_adapter.frameworks import torchtitan
from gh_titan.qwen3 import get_train_spec

FIELDS = Fields(
    sizes=("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
           "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"),
    numbers=("rms_norm_eps",),
    flags=("tie_word_embeddings",),
    mapped=("pad_token_id", "original_max_position_embeddings"),
    only={"hidden_act": (("silu", "swish"), "the FeedForward is SwiGLU with F.silu only"),
          "attention_bias": ((False,), "the projections have no bias"),
          "use_sliding_window": ((False,), "the attention has no sliding window"),
          "layer_types[]": (("full_attention",), "every layer attends causally")},
    divides=(("num_key_value_heads", "num_attention_heads"),),
    rope_types=("default", "llama3"),
    rope_keys=("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"),
    ignored={"sliding_window": "used only with use_sliding_window, which is false here",
             "max_window_layers": "chooses sliding layers, which exist only with "
                                  "use_sliding_window (false here)"},
)

SPEC = torchtitan.model_spec(get_train_spec(), name="qwen3", model_types=("qwen3",),
                             fields=FIELDS)
