"""Qwen3ModelArgs: a dense Qwen3 config (model_type "qwen3") as AReaL's Archon reads it
(areal/experimental/models/archon/qwen3/model/args.py, Qwen3ModelArgs.from_hf_config).

AReaL reads transformers' parsed Qwen3Config, so an absent field takes Qwen3Config's default
(transformers 5: num_key_value_heads 32, head_dim 128, rms_norm_eps 1e-6,
max_position_embeddings 32768, rope_theta 10000.0); the sizes are required here.

AReaL's model has no attention biases, no sliding window, no padding row, no RoPE scaling and
always SiLU; where transformers would compute something else for a config (attention_bias,
use_sliding_window, a sliding layer in layer_types, pad_token_id, a scaled rope type, another
hidden_act) AReaL's reader silently ignores the field, and this port refuses it instead
(ValueError naming the field). MoE (num_experts > 1) is not ported: the spec serves "qwen3".
"""

from __future__ import annotations

from dataclasses import dataclass

from gh_areal.config import ConfigReader, field_error

MODEL_TYPES = ("qwen3",)
ATTN_TYPES = ("varlen", "sdpa")

# Every top-level field _parse may read (the accounting's fallback when parsing fails).
_READ_FIELDS = (
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
    "rms_norm_eps", "hidden_act", "tie_word_embeddings", "pad_token_id", "attention_bias",
    "rope_parameters", "rope_scaling", "rope_theta", "use_sliding_window", "sliding_window",
    "max_window_layers", "layer_types", "qk_norm",
)


@dataclass
class Qwen3ModelArgs:
    dim: int = 1024                  # hidden_size
    n_layers: int = 28               # num_hidden_layers
    n_heads: int = 16                # num_attention_heads
    n_kv_heads: int = 8              # num_key_value_heads
    vocab_size: int = 151936
    head_dim: int = 128
    hidden_dim: int = 3072           # intermediate_size
    norm_eps: float = 1e-6           # rms_norm_eps (every norm, q_norm / k_norm too)
    rope_theta: float = 1000000.0    # as stored in config.json (int or float)
    qk_norm: bool = True
    max_seq_len: int = 4096          # max_position_embeddings: the RoPE cache's length
    enable_weight_tying: bool = False  # tie_word_embeddings
    # AReaL's ArchonEngineConfig.attn_type (default "varlen"). The model runs varlen where the
    # flash kernels run (CUDA, fp16 / bf16) and sdpa elsewhere; GH_AREAL_ATTN=sdpa|varlen at
    # build time forces one (varlen then refuses where it cannot run).
    attn_type: str = "varlen"
    model_type: str = "qwen3"

    @classmethod
    def from_hf_config(cls, config: dict) -> "Qwen3ModelArgs":
        return _parse(ConfigReader(config))[0]

    @staticmethod
    def config_accounting(config: dict) -> dict[str, str | None]:
        try:
            return _parse(ConfigReader(config))[1].accounting()
        except ValueError:
            # The config gate fails on args_from_hf_config's error; account what is known.
            reader = ConfigReader(config if isinstance(config, dict) else {})
            reader.ignore_common()
            reader.mapped.update(f for f in _READ_FIELDS if f in reader.config)
            return reader.accounting()


def gate_facts(args: Qwen3ModelArgs) -> dict:
    return {"vocab_size": args.vocab_size, "num_hidden_layers": args.n_layers,
            "num_key_value_heads": args.n_kv_heads, "head_dim": args.head_dim,
            "max_position_embeddings": args.max_seq_len,
            "tie_word_embeddings": args.enable_weight_tying, "min_sliding_window": 0}


def _rope_theta(reader: ConfigReader):
    """rope_theta from rope_parameters (transformers 5) / rope_scaling (older configs), else the
    top level, else Qwen3Config's default 10000.0, as transformers standardises it and AReaL's
    BaseModelArgs._get_rope_theta then reads it. Only the default rope type is computed."""
    params, scaling = reader.raw("rope_parameters"), reader.raw("rope_scaling")
    if params and scaling and params != scaling:
        raise ValueError(f"config fields 'rope_parameters' = {params} and 'rope_scaling' = "
                         f"{scaling} disagree; transformers reads only one of them")
    d, prefix = (scaling, "rope_scaling") if scaling else (params or {}, "rope_parameters")
    if not isinstance(d, dict):
        raise field_error(prefix, d, "expected an object")
    for key, value in d.items():
        if key in ("rope_type", "type"):
            if value != "default":
                raise field_error(f"{prefix}.{key}", value,
                                  "AReaL's Archon Qwen3 computes only the default RoPE (its "
                                  "cache has no scaling); transformers would scale it")
        elif key != "rope_theta":
            raise field_error(f"{prefix}.{key}", value,
                              "not computed by AReaL's Archon Qwen3 (default RoPE only)")
    top = reader.number("rope_theta", None)
    theta = d.get("rope_theta", top if top is not None else 10000.0)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise field_error(f"{prefix}.rope_theta" if "rope_theta" in d else "rope_theta", theta,
                          "must be a positive number")
    return theta


def _parse(reader: ConfigReader) -> tuple[Qwen3ModelArgs, ConfigReader]:
    reader.ignore_common()
    model_type = reader.raw("model_type")
    if model_type not in (None, *MODEL_TYPES):
        raise field_error("model_type", model_type, "this adapter serves \"qwen3\"")
    vocab_size = reader.positive_int("vocab_size")
    dim = reader.positive_int("hidden_size")
    hidden_dim = reader.positive_int("intermediate_size")
    n_layers = reader.positive_int("num_hidden_layers")
    n_heads = reader.positive_int("num_attention_heads")
    # Qwen3Config: absent -> 32, null -> num_attention_heads.
    if "num_key_value_heads" in reader.config and reader.config["num_key_value_heads"] is None:
        reader.raw("num_key_value_heads")
        n_kv_heads = n_heads
    else:
        n_kv_heads = reader.positive_int("num_key_value_heads", 32)
    if n_heads % n_kv_heads:
        raise field_error("num_key_value_heads", n_kv_heads,
                          f"does not divide num_attention_heads = {n_heads}")
    head_dim = reader.positive_int("head_dim", 128)
    if head_dim % 2:
        raise field_error("head_dim", head_dim, "RoPE rotates halves: must be even")
    max_seq_len = reader.positive_int("max_position_embeddings", 32768)
    eps = reader.number("rms_norm_eps", 1e-6)
    if not eps > 0:
        raise field_error("rms_norm_eps", eps, "must be positive")
    act = reader.raw("hidden_act")
    if act not in (None, "silu", "swish"):
        raise field_error("hidden_act", act, "AReaL's Archon Qwen3 FeedForward is SwiGLU with "
                          "F.silu only")
    tied = reader.bool("tie_word_embeddings", False)
    if reader.bool("attention_bias", False):
        raise field_error("attention_bias", True, "AReaL's Archon Qwen3 projections have no "
                          "bias; transformers would add q/k/v/o biases")
    pad = reader.raw("pad_token_id")
    if pad is not None:
        raise field_error("pad_token_id", pad,
                          "AReaL's Archon Qwen3 embedding has no padding row; transformers' "
                          "nn.Embedding(padding_idx) keeps that row's gradient at zero")
    qk_norm = reader.raw("qk_norm")
    if qk_norm not in (None, True):
        raise field_error("qk_norm", qk_norm, "transformers' Qwen3 always applies q_norm / "
                          "k_norm")
    if reader.bool("use_sliding_window", False):
        raise field_error("use_sliding_window", True,
                          "AReaL's Archon Qwen3 attention has no sliding window")
    reader.ignore("sliding_window", "transformers' Qwen3Config sets it to None unless "
                  "use_sliding_window, which is false here")
    reader.ignore("max_window_layers", "chooses the sliding layers, which exist only with "
                  "use_sliding_window (false here)")
    layer_types = reader.raw("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != n_layers:
            raise field_error("layer_types", layer_types,
                              f"expected a list of num_hidden_layers = {n_layers} entries")
        for i, t in enumerate(layer_types):
            if t != "full_attention":
                raise field_error(f"layer_types[{i}]", t, "AReaL's Archon Qwen3 computes full "
                                  "causal attention in every layer")
    theta = _rope_theta(reader)
    attn_type = "varlen"
    args = Qwen3ModelArgs(dim=dim, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                          vocab_size=vocab_size, head_dim=head_dim, hidden_dim=hidden_dim,
                          norm_eps=eps, rope_theta=theta, qk_norm=True,
                          max_seq_len=max_seq_len, enable_weight_tying=tied,
                          attn_type=attn_type, model_type="qwen3")
    return args, reader
