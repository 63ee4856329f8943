"""Config fields both families read, with upstream's defaults passed in by each family."""

from __future__ import annotations

from typing import Any

from gh_titan.common.config import ConfigReader, field_error

ACTIVATIONS = ("silu", "swish")  # transformers' ACT2FN: both are F.silu


def parse_common(reader: ConfigReader, model_types: tuple[str, ...], *,
                 kv_heads_absent: Any, head_dim_absent: Any, head_dim_null_ok: bool,
                 max_pos_default: int, norm_eps_default: float) -> dict:
    """The decoder's sizes and switches as {TitanArgs field: value}.

    kv_heads_absent: num_key_value_heads when the key is absent ("heads": the query head
        count); a JSON null always means the query head count (both configs' __post_init__).
    head_dim_absent: head_dim when absent ("derived": hidden_size / num_attention_heads);
        head_dim_null_ok: whether a JSON null means derived too (else refused)."""
    reader.ignore_common()
    model_type = reader.raw("model_type")
    if model_type is not None and model_type not in model_types:
        raise field_error("model_type", model_type, "this adapter serves "
                          + ", ".join(f'"{t}"' for t in model_types))
    out: dict[str, Any] = dict(
        model_type=model_type or model_types[0],
        vocab_size=reader.positive_int("vocab_size"),
        dim=reader.positive_int("hidden_size"),
        hidden_dim=reader.positive_int("intermediate_size"),
        n_layers=reader.positive_int("num_hidden_layers"),
        n_heads=reader.positive_int("num_attention_heads"),
    )
    n_heads = out["n_heads"]
    if reader.has_key("num_key_value_heads") or kv_heads_absent == "heads":
        out["n_kv_heads"] = reader.positive_int("num_key_value_heads", n_heads)
    else:
        out["n_kv_heads"] = kv_heads_absent
    if n_heads % out["n_kv_heads"]:
        absent = "" if reader.has_key("num_key_value_heads") else \
            " (absent: the config class's default)"
        raise field_error("num_key_value_heads", out["n_kv_heads"],
                          f"does not divide num_attention_heads = {n_heads}{absent}")

    def derived_head_dim() -> int:
        if out["dim"] % n_heads:
            raise field_error("hidden_size", out["dim"],
                              f"is not a multiple of num_attention_heads = {n_heads} and "
                              "head_dim is not given")
        return out["dim"] // n_heads

    if reader.present("head_dim"):
        head_dim = reader.positive_int("head_dim")
    elif reader.has_key("head_dim"):
        reader.raw("head_dim")
        if not head_dim_null_ok:
            raise field_error("head_dim", None, "upstream's attention cannot run without a "
                              "head size")
        head_dim = derived_head_dim()
    else:
        head_dim = derived_head_dim() if head_dim_absent == "derived" else head_dim_absent
    if head_dim % 2:
        raise field_error("head_dim", head_dim, "must be even (RoPE rotates pairs)")
    out["head_dim"] = head_dim

    out["max_seq_len"] = reader.positive_int("max_position_embeddings", max_pos_default)
    eps = reader.number("rms_norm_eps", norm_eps_default)
    if not eps > 0:
        raise field_error("rms_norm_eps", eps, "must be positive")
    out["norm_eps"] = float(eps)
    act = reader.raw("hidden_act")
    if act is not None and act not in ACTIVATIONS:
        raise field_error("hidden_act", act, "activation not implemented by this adapter "
                          "(implemented: " + ", ".join(f'"{a}"' for a in ACTIVATIONS) + ")")
    out["tie_word_embeddings"] = reader.bool("tie_word_embeddings", False)
    pad = reader.int("pad_token_id", None)
    if pad is not None and not 0 <= pad < out["vocab_size"]:
        raise field_error("pad_token_id", pad, f"must be in [0, vocab_size = {out['vocab_size']})")
    out["pad_token_id"] = pad
    reader.must_be("attention_bias", False, False,
                   "attention biases are not implemented by this adapter")
    return out
