"""Gatehouse SPEC for Llama 3 as torchtitan writes it (gh_titan.llama), through the torchtitan
shim."""

from gatehouse_adapter import Fields
from gatehouse_adapter.frameworks import torchtitan
from gh_titan.llama import get_train_spec

FIELDS = Fields(
    sizes=("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
           "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"),
    numbers=("rms_norm_eps",),
    flags=("tie_word_embeddings",),
    mapped=("pad_token_id", "original_max_position_embeddings"),
    only={"hidden_act": (("silu", "swish"), "the FeedForward is SwiGLU with F.silu only"),
          "attention_bias": ((False,), "the projections have no bias"),
          "mlp_bias": ((False,), "the FeedForward has no bias"),
          "pretraining_tp": ((1,), "no pretraining tensor-parallel slicing")},
    divides=(("num_key_value_heads", "num_attention_heads"),),
    rope_types=("default", "llama3"),
    rope_keys=("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"),
    unread_flags={"rope_interleaved": (
        "false or absent: modeling_llama.py never reads it and rotates halves",
        "declares q/k rows in interleaved order, which upstream does not compute")},
    ignored={"is_llama_config": "a converter's marker: modeling_llama.py never reads it"},
)

SPEC = torchtitan.model_spec(get_train_spec(), name="llama", model_types=("llama",),
                             fields=FIELDS)
