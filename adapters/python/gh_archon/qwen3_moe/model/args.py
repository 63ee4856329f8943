"""Qwen3MoeModelArgs: the Qwen3-MoE config (model_type "qwen3_moe") as the adapter computes it.

Defaults are transformers' Qwen3MoeConfig defaults (5.24) for optional fields; the sizes are
required. Layer l is sparse (MoE) when l is not in mlp_only_layers, num_experts > 0 and
(l + 1) % decoder_sparse_step == 0; the sliding window applies to every layer, and only with
use_sliding_window (Qwen3MoeConfig.__post_init__).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gh_archon.common.config import ConfigReader, field_error
from gh_archon.llama.model.args import parse_core
from gh_archon.llama.model.rope import RopeArgs, parse_rope

MODEL_TYPES = ("qwen3_moe",)

_READ_FIELDS = (
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
    "rms_norm_eps", "hidden_act", "tie_word_embeddings", "pad_token_id", "attention_bias",
    "rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor",
    "original_max_position_embeddings", "use_sliding_window", "sliding_window", "num_experts",
    "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
    "decoder_sparse_step", "mlp_only_layers",
)


@dataclass
class Qwen3MoeModelArgs:
    dim: int = 2048                      # hidden_size
    n_layers: int = 24                   # num_hidden_layers
    n_heads: int = 32                    # num_attention_heads
    n_kv_heads: int = 4                  # num_key_value_heads
    head_dim: int = 64
    hidden_dim: int = 6144               # intermediate_size (dense layers)
    vocab_size: int = 151936
    norm_eps: float = 1e-6               # rms_norm_eps (also q_norm / k_norm)
    max_seq_len: int = 32768             # max_position_embeddings
    rope: RopeArgs = field(default_factory=RopeArgs)
    tie_word_embeddings: bool = False
    attention_bias: bool = False         # q/k/v/o biases
    hidden_act: str = "silu"
    pad_token_id: int | None = None
    sliding_window: int | None = None    # every layer, when use_sliding_window
    num_experts: int = 128
    top_k: int = 8                       # num_experts_per_tok
    moe_inter_dim: int = 768             # moe_intermediate_size
    norm_topk_prob: bool = False
    moe_layers: tuple[bool, ...] = ()    # per layer: sparse MoE block (True) or dense MLP
    model_type: str = "qwen3_moe"

    @classmethod
    def from_hf_config(cls, config: dict) -> "Qwen3MoeModelArgs":
        return _parse(ConfigReader(config))[0]

    @staticmethod
    def config_accounting(config: dict) -> dict[str, str | None]:
        # Refused (the config gate fails on args_from_hf_config's error): what is known.
        return ConfigReader.account(config, _parse, declare=_declare_ignored,
                                    read_fields=_READ_FIELDS)


def _declare_ignored(reader: ConfigReader) -> None:
    reader.ignore_common()
    reader.ignore("max_window_layers",
                  "Qwen3MoeConfig does not define it and modeling_qwen3_moe.py never reads it: "
                  "with use_sliding_window every layer slides (docs/config-fields.md)")
    flag = reader.config.get("output_router_logits")
    router_logits = flag is True
    reader.ignore("output_router_logits",
                  "true: upstream adds router_aux_loss_coef x the load-balancing loss to the "
                  "training loss; the training gate uses the LM cross-entropy only and does not "
                  "reproduce that term; no effect on logits, decode or save" if router_logits else
                  "false: upstream adds no router auxiliary loss; an output/loss flag with no "
                  "effect on logits")
    reader.ignore("router_aux_loss_coef",
                  "weight of the router load-balancing loss in training, which the training gate "
                  "does not reproduce (output_router_logits is true); no effect on logits, "
                  "decode or save" if router_logits else
                  "weight of the router load-balancing loss, unused while output_router_logits "
                  "is false")


def _parse(reader: ConfigReader) -> tuple[Qwen3MoeModelArgs, ConfigReader]:
    _declare_ignored(reader)
    # Qwen3MoeConfig: num_key_value_heads defaults to 4 (not num_attention_heads), rms_norm_eps
    # to 1e-6, max_position_embeddings to 32768.
    core = parse_core(reader, kv_heads_default_is_heads=False, kv_heads_default=4,
                      norm_eps_default=1e-6, max_pos_default=32768)
    if core["model_type"] not in (None, *MODEL_TYPES):
        raise field_error("model_type", core["model_type"], "this adapter serves \"qwen3_moe\"")
    core["model_type"] = core["model_type"] or "qwen3_moe"
    attention_bias = reader.bool("attention_bias", False)
    rope = parse_rope(reader, 10000.0)

    use_sliding = reader.bool("use_sliding_window", False)
    # Absent: Qwen3MoeConfig's default 4096; null: no window (upstream passes None through).
    if "sliding_window" in reader.config and reader.config["sliding_window"] is None:
        window = reader.raw("sliding_window")
    else:
        window = reader.positive_int("sliding_window", 4096)
    sliding_window = window if use_sliding else None

    # num_experts is spelled "num_experts" (Hub configs) or "num_local_experts" (what
    # save_pretrained writes through Qwen3MoeConfig.attribute_map).
    experts = reader.int("num_experts", None)
    local = reader.int("num_local_experts", None)
    if experts is not None and local is not None and experts != local:
        raise field_error("num_local_experts", local,
                          f"disagrees with num_experts = {experts} (the same Qwen3MoeConfig "
                          "attribute)")
    num_experts = experts if experts is not None else (local if local is not None else 128)
    if num_experts < 0:
        raise field_error("num_experts" if experts is not None else "num_local_experts",
                          num_experts, "must not be negative")
    top_k = reader.positive_int("num_experts_per_tok", 8)
    if num_experts > 0 and top_k > num_experts:
        raise field_error("num_experts_per_tok", top_k,
                          f"exceeds the number of experts = {num_experts}")
    moe_inter = reader.positive_int("moe_intermediate_size", 768)
    norm_topk_prob = reader.bool("norm_topk_prob", False)
    step = reader.int("decoder_sparse_step", 1)
    if step < 1:
        raise field_error("decoder_sparse_step", step,
                          "must be >= 1 (layer l is sparse when (l + 1) % decoder_sparse_step "
                          "== 0)")
    mlp_only = reader.raw("mlp_only_layers")
    if mlp_only is None:
        mlp_only = []
    if not isinstance(mlp_only, list):
        raise field_error("mlp_only_layers", mlp_only, "expected a list of layer indices")
    for i, e in enumerate(mlp_only):
        if isinstance(e, bool) or not isinstance(e, int):
            raise field_error(f"mlp_only_layers[{i}]", e, "expected an integer layer index")
    moe_layers = tuple(
        l not in mlp_only and num_experts > 0 and (l + 1) % step == 0
        for l in range(core["n_layers"]))
    args = Qwen3MoeModelArgs(rope=rope, attention_bias=attention_bias,
                             sliding_window=sliding_window, num_experts=num_experts, top_k=top_k,
                             moe_inter_dim=moe_inter, norm_topk_prob=norm_topk_prob,
                             moe_layers=moe_layers, **core)
    return args, reader
