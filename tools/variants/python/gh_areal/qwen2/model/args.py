"""Qwen2ModelArgs as AReaL's Archon reads them (areal/experimental/models/archon/qwen2/model/
args.py): from transformers' parsed config object, whose class fills in the defaults of absent
fields. What the model cannot compute (a sliding window, scaled RoPE, a padding row, another
activation) the framework does not check; the port's spec declares it (gh_areal.qwen2.spec)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gh_areal.base import BaseModelArgs


@dataclass
class Qwen2ModelArgs(BaseModelArgs):
    dim: int = 896
    n_layers: int = 24
    n_heads: int = 14
    n_kv_heads: int = 2
    vocab_size: int = 151936
    head_dim: int = 64
    hidden_dim: int = 4864
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0   # as stored in config.json (int or float)
    max_seq_len: int = 32768      # max_position_embeddings: the RoPE cache's length
    attention_bias: bool = True   # q/k/v biases (Qwen2 always has them)
    qk_norm: bool = False
    eos_id: int = 151645
    enable_weight_tying: bool = False
    is_critic: bool = False

    @classmethod
    def from_hf_config(cls, hf_config: Any, is_critic: bool = False, **kwargs) -> "Qwen2ModelArgs":
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
            rope_theta=cls._get_rope_theta(hf_config, default=10000.0),
            max_seq_len=getattr(hf_config, "max_position_embeddings", 32768),
            attention_bias=getattr(hf_config, "attention_bias", True),
            eos_id=getattr(hf_config, "eos_token_id", 151645),
            enable_weight_tying=getattr(hf_config, "tie_word_embeddings", False),
            is_critic=is_critic,
            attn_type=kwargs.get("attn_type", BaseModelArgs.attn_type),
        )
