"""Qwen3ModelArgs as AReaL's Archon reads them (areal/experimental/models/archon/qwen3/model/
args.py), dense only (MoE is not ported): from transformers' parsed Qwen3Config, whose class
fills in the defaults of absent fields (num_key_value_heads 32, head_dim 128, ...). What the
model cannot compute (attention biases, a sliding window, scaled RoPE, a padding row) the
framework does not check; the port's spec declares it (gh_areal.qwen3.spec)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gh_areal.base import BaseModelArgs


@dataclass
class Qwen3ModelArgs(BaseModelArgs):
    dim: int = 1024
    n_layers: int = 28
    n_heads: int = 16
    n_kv_heads: int = 8
    vocab_size: int = 151936
    head_dim: int = 128
    hidden_dim: int = 3072
    norm_eps: float = 1e-6          # every norm, q_norm / k_norm too
    rope_theta: float = 1000000.0   # as stored in config.json (int or float)
    qk_norm: bool = True
    attention_bias: bool = False
    max_seq_len: int = 4096         # max_position_embeddings: the RoPE cache's length
    eos_id: int = 151645
    enable_weight_tying: bool = False
    is_critic: bool = False

    @classmethod
    def from_hf_config(cls, hf_config: Any, is_critic: bool = False, **kwargs) -> "Qwen3ModelArgs":
        n_heads = hf_config.num_attention_heads
        kv_heads = getattr(hf_config, "num_key_value_heads", None)
        head_dim = getattr(hf_config, "head_dim", None)
        return cls(
            dim=hf_config.hidden_size,
            n_layers=hf_config.num_hidden_layers,
            n_heads=n_heads,
            n_kv_heads=n_heads if kv_heads is None else kv_heads,
            vocab_size=hf_config.vocab_size,
            head_dim=hf_config.hidden_size // n_heads if head_dim is None else head_dim,
            hidden_dim=hf_config.intermediate_size,
            norm_eps=hf_config.rms_norm_eps,
            rope_theta=cls._get_rope_theta(hf_config, default=1000000.0),
            qk_norm=getattr(hf_config, "qk_norm", True),
            max_seq_len=getattr(hf_config, "max_position_embeddings", 4096),
            eos_id=getattr(hf_config, "eos_token_id", 151645),
            enable_weight_tying=getattr(hf_config, "tie_word_embeddings", False),
            is_critic=is_critic,
            attn_type=kwargs.get("attn_type", BaseModelArgs.attn_type),
        )
