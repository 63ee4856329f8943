"""Llama (model_type "llama") config.json -> TitanArgs, with transformers' LlamaConfig defaults
(5.24) for optional fields; the sizes are required. What this adapter does not compute as
upstream raises ValueError naming the field: attention or MLP biases, pretraining_tp != 1, RoPE
types other than default and llama3, partial rotary factors, rope_interleaved = true."""

from __future__ import annotations

from gh_titan.common.args import parse_common
from gh_titan.common.config import ConfigReader, field_error
from gh_titan.common.layers import TitanArgs
from gh_titan.common.rope import parse_rope

MODEL_TYPES = ("llama",)

# Every top-level field _parse may read (the accounting's fallback when parsing fails).
_READ_FIELDS = (
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
    "rms_norm_eps", "hidden_act", "tie_word_embeddings", "pad_token_id", "attention_bias",
    "mlp_bias", "pretraining_tp", "rope_parameters", "rope_scaling", "rope_theta",
    "partial_rotary_factor", "original_max_position_embeddings", "rope_interleaved",
)


def _declare_ignored(reader: ConfigReader) -> None:
    reader.ignore_common()
    reader.ignore("is_llama_config",
                  "a converter's marker (SmolLM2's nanotron export): LlamaConfig does not define "
                  "it and modeling_llama.py never reads it")
    if not reader.config.get("rope_interleaved"):
        reader.ignore("rope_interleaved",
                      "false or absent: modeling_llama.py never reads it and rotates halves; the "
                      "checkpoint's q/k rows are in that layout, which from_hf permutes")


def _parse(reader: ConfigReader) -> TitanArgs:
    _declare_ignored(reader)
    if reader.config.get("rope_interleaved"):
        reader.raw("rope_interleaved")
        raise field_error("rope_interleaved", reader.config["rope_interleaved"],
                          "declares q/k rows in interleaved order, which upstream does not "
                          "compute (it always rotates halves): convert the checkpoint's q/k "
                          "rows to the rotate-half layout")
    core = parse_common(reader, MODEL_TYPES, kv_heads_absent="heads", head_dim_absent="derived",
                        head_dim_null_ok=True, max_pos_default=2048, norm_eps_default=1e-6)
    reader.must_be("mlp_bias", False, False, "MLP biases are not implemented by this adapter")
    reader.must_be("pretraining_tp", 1, 1,
                   "only 1 is implemented (no pretraining tensor-parallel slicing)")
    rope = parse_rope(reader, 10000.0)  # LlamaConfig's default_theta
    return TitanArgs(rope=rope, qk_norm=False, **core)


def args_from_hf_config(config: dict) -> TitanArgs:
    return _parse(ConfigReader(config))


def config_accounting(config: dict) -> dict[str, str | None]:
    reader = ConfigReader(config if isinstance(config, dict) else {})
    try:
        _parse(reader)
    except ValueError:
        # args_from_hf_config's error fails the config gate; account what is known.
        reader = ConfigReader(config if isinstance(config, dict) else {})
        _declare_ignored(reader)
        reader.mapped.update(f for f in _READ_FIELDS if f in reader.config)
    return reader.accounting()
