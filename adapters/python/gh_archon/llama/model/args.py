"""LlamaModelArgs: the Llama config (model_type "llama") as the adapter computes it.

Defaults are transformers' LlamaConfig defaults (5.24) for optional fields; the sizes are
required. A value the adapter would not compute as upstream raises ValueError naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gh_archon.common.config import ConfigReader, field_error
from gh_archon.llama.model.rope import RopeArgs, parse_rope
from gh_archon.common.layers import ACTIVATIONS

MODEL_TYPES = ("llama",)

# Every top-level field _parse may read (the accounting's fallback when parsing fails).
_READ_FIELDS = (
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
    "rms_norm_eps", "hidden_act", "tie_word_embeddings", "pad_token_id", "attention_bias",
    "mlp_bias", "pretraining_tp", "rope_parameters", "rope_scaling", "rope_theta",
    "partial_rotary_factor", "original_max_position_embeddings",
)


@dataclass
class LlamaModelArgs:
    dim: int = 4096                      # hidden_size
    n_layers: int = 32                   # num_hidden_layers
    n_heads: int = 32                    # num_attention_heads
    n_kv_heads: int = 32                 # num_key_value_heads
    head_dim: int = 128
    hidden_dim: int = 11008              # intermediate_size
    vocab_size: int = 32000
    norm_eps: float = 1e-6               # rms_norm_eps
    max_seq_len: int = 2048              # max_position_embeddings
    rope: RopeArgs = field(default_factory=RopeArgs)
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"
    pad_token_id: int | None = None      # nn.Embedding padding_idx (zero gradient for that row)
    model_type: str = "llama"

    @classmethod
    def from_hf_config(cls, config: dict) -> "LlamaModelArgs":
        return _parse(ConfigReader(config))[0]

    @staticmethod
    def config_accounting(config: dict) -> dict[str, str | None]:
        # Refused (the config gate fails on args_from_hf_config's error): what is known.
        return ConfigReader.account(config, _parse, declare=_declare_ignored,
                                    read_fields=_READ_FIELDS)


def _declare_ignored(reader: ConfigReader) -> None:
    reader.ignore_common()
    # Written by SmolLM2's nanotron converter; docs/config-fields.md.
    reader.ignore("is_llama_config",
                  "a converter's marker: LlamaConfig does not define it and modeling_llama.py "
                  "never reads it (docs/config-fields.md)")


def parse_core(reader: ConfigReader, kv_heads_default_is_heads: bool, kv_heads_default: int,
               norm_eps_default: float, max_pos_default: int) -> dict:
    """Fields every decoder of this package reads (upstream defaults passed in)."""
    reader.ignore_common()
    model_type = reader.raw("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise field_error("model_type", model_type, "expected a string")
    out = dict(
        model_type=model_type,
        vocab_size=reader.positive_int("vocab_size"),
        dim=reader.positive_int("hidden_size"),
        hidden_dim=reader.positive_int("intermediate_size"),
        n_layers=reader.positive_int("num_hidden_layers"),
        n_heads=reader.positive_int("num_attention_heads"),
    )
    out["n_kv_heads"] = reader.positive_int(
        "num_key_value_heads", out["n_heads"] if kv_heads_default_is_heads else kv_heads_default)
    if out["n_heads"] % out["n_kv_heads"]:
        raise field_error("num_key_value_heads", out["n_kv_heads"],
                          f"does not divide num_attention_heads = {out['n_heads']}")
    head_dim = reader.positive_int("head_dim", None)
    if head_dim is None:
        if out["dim"] % out["n_heads"]:
            raise field_error("hidden_size", out["dim"],
                              f"is not a multiple of num_attention_heads = {out['n_heads']} "
                              "and head_dim is not given")
        head_dim = out["dim"] // out["n_heads"]
    out["head_dim"] = head_dim
    out["max_seq_len"] = reader.positive_int("max_position_embeddings", max_pos_default)
    eps = reader.number("rms_norm_eps", norm_eps_default)
    if not eps > 0:
        raise field_error("rms_norm_eps", eps, "must be positive")
    out["norm_eps"] = eps
    out["hidden_act"] = reader.string_in("hidden_act", "silu", ACTIVATIONS, "activation")
    out["tie_word_embeddings"] = reader.bool("tie_word_embeddings", False)
    pad = reader.int("pad_token_id", None)
    if pad is not None and not 0 <= pad < out["vocab_size"]:
        # nn.Embedding would refuse it; upstream too.
        raise field_error("pad_token_id", pad, f"must be in [0, vocab_size = {out['vocab_size']})")
    out["pad_token_id"] = pad
    return out


def _parse(reader: ConfigReader) -> tuple[LlamaModelArgs, ConfigReader]:
    _declare_ignored(reader)
    core = parse_core(reader, kv_heads_default_is_heads=True, kv_heads_default=0,
                      norm_eps_default=1e-6, max_pos_default=2048)
    if core["model_type"] not in (None, *MODEL_TYPES):
        raise field_error("model_type", core["model_type"], "this adapter serves \"llama\"")
    core["model_type"] = core["model_type"] or "llama"
    attention_bias = reader.bool("attention_bias", False)
    mlp_bias = reader.bool("mlp_bias", False)
    tp = reader.int("pretraining_tp", 1)
    if tp != 1:
        raise field_error("pretraining_tp", tp,
                          "only 1 is supported (no pretraining tensor-parallel slicing)")
    reader.ignore_unread_flag(
        "rope_interleaved",
        "modeling_llama.py never reads it and always rotates halves (rotate_half); "
        "docs/config-fields.md",
        "declares interleaved RoPE, which upstream does not compute: convert the q/k projection "
        "rows to the rotate-half layout")
    # LlamaConfig.default_theta (RotaryEmbeddingConfigMixin) is 10000.0.
    rope = parse_rope(reader, 10000.0)
    args = LlamaModelArgs(rope=rope, attention_bias=attention_bias, mlp_bias=mlp_bias, **core)
    return args, reader
