"""Dense Qwen3 (model_type "qwen3") config.json -> TitanArgs, with transformers' Qwen3Config
defaults (5.24) for optional fields (head_dim 128 and num_key_value_heads 32 when absent, as the
config class has them); the other sizes are required. q_norm / k_norm act per head before RoPE.
Refused, naming the field: attention biases, sliding windows (use_sliding_window = true or a
layer_types entry other than "full_attention"), RoPE types other than default and llama3,
partial rotary factors."""

from __future__ import annotations

from gh_titan.common.args import parse_common
from gh_titan.common.config import ConfigReader, field_error
from gh_titan.common.layers import TitanArgs
from gh_titan.common.rope import parse_rope

MODEL_TYPES = ("qwen3",)

_READ_FIELDS = (
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
    "rms_norm_eps", "hidden_act", "tie_word_embeddings", "pad_token_id", "attention_bias",
    "use_sliding_window", "layer_types", "rope_parameters", "rope_scaling", "rope_theta",
    "partial_rotary_factor", "original_max_position_embeddings", "sliding_window",
    "max_window_layers",
)


def _declare_ignored(reader: ConfigReader) -> None:
    reader.ignore_common()
    if not reader.config.get("use_sliding_window"):
        reader.ignore("sliding_window",
                      "Qwen3Config sets it to None unless use_sliding_window is true (it is not "
                      "here): every layer attends causally over the whole sequence")
        reader.ignore("max_window_layers",
                      "selects which layers slide only when use_sliding_window is true (it is "
                      "not here)")


def _parse(reader: ConfigReader) -> TitanArgs:
    _declare_ignored(reader)
    core = parse_common(reader, MODEL_TYPES, kv_heads_absent=32, head_dim_absent=128,
                        head_dim_null_ok=False, max_pos_default=32768, norm_eps_default=1e-6)
    reader.must_be("use_sliding_window", False, False,
                   "sliding-window attention is not implemented by this adapter")
    layer_types = reader.raw("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != core["n_layers"]:
            raise field_error("layer_types", layer_types,
                              f"expected a list of num_hidden_layers = {core['n_layers']} entries")
        other = sorted({t for t in layer_types if t != "full_attention"}, key=str)
        if other:
            raise field_error("layer_types", layer_types,
                              f"layer types {other} are not implemented by this adapter (only "
                              "\"full_attention\")")
    rope = parse_rope(reader, 10000.0)  # RotaryEmbeddingConfigMixin's default_theta
    return TitanArgs(rope=rope, qk_norm=True, **core)


def args_from_hf_config(config: dict) -> TitanArgs:
    return _parse(ConfigReader(config))


def config_accounting(config: dict) -> dict[str, str | None]:
    reader = ConfigReader(config if isinstance(config, dict) else {})
    try:
        _parse(reader)
    except ValueError:
        reader = ConfigReader(config if isinstance(config, dict) else {})
        _declare_ignored(reader)
        reader.mapped.update(f for f in _READ_FIELDS if f in reader.config)
    return reader.accounting()
