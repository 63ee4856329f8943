"""The args both gh_titan families are built from, in torchtitan's names (torchtitan/models/
llama3/model/args.py TransformerModelArgs, torchtitan/models/qwen3/model/args.py
Qwen3ModelArgs), with a ``from_hf_config`` that reads transformers' parsed config object (its
class has filled in the defaults of absent fields and standardised RoPE into
``rope_parameters``). torchtitan itself builds args from named flavors; a port that loads Hugging
Face checkpoints reads them from the checkpoint's config instead.

What the port cannot compute is declared in each family's spec (gatehouse_adapter.Fields) and
refused before this runs; what is left here are the checks on values transformers filled in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gatehouse_adapter import field_error
from gh_titan.common.rope import RopeArgs, rope_args_from_hf


@dataclass
class TitanArgs:
    dim: int = 4096                 # hidden_size
    n_layers: int = 32              # num_hidden_layers
    n_heads: int = 32               # num_attention_heads
    n_kv_heads: int = 8             # num_key_value_heads
    head_dim: int = 128
    hidden_dim: int = 14336         # intermediate_size
    vocab_size: int = 128256
    norm_eps: float = 1e-5          # rms_norm_eps
    max_seq_len: int = 131072       # max_position_embeddings (the freqs_cis table's length)
    rope: RopeArgs = field(default_factory=RopeArgs)
    enable_weight_tying: bool = False
    pad_token_id: int | None = None   # nn.Embedding padding_idx, as upstream's embedding
    qk_norm: bool = False             # Qwen3: RMSNorm per head on q and k before RoPE
    attn_type: str = "sdpa"
    model_type: str = "llama"

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> "TitanArgs":
        n_heads = hf_config.num_attention_heads
        kv_heads = getattr(hf_config, "num_key_value_heads", None) or n_heads
        head_dim = getattr(hf_config, "head_dim", None)
        if head_dim is None:
            if hf_config.hidden_size % n_heads:
                raise field_error("hidden_size", hf_config.hidden_size,
                                  f"is not a multiple of num_attention_heads = {n_heads} and "
                                  "head_dim is not given")
            head_dim = hf_config.hidden_size // n_heads
        if head_dim % 2:
            raise field_error("head_dim", head_dim, "must be even (RoPE rotates pairs)")
        vocab = hf_config.vocab_size
        pad = getattr(hf_config, "pad_token_id", None)
        if pad is not None and not (isinstance(pad, int) and 0 <= pad < vocab):
            raise field_error("pad_token_id", pad, f"must be in [0, vocab_size = {vocab})")
        return cls(dim=hf_config.hidden_size, n_layers=hf_config.num_hidden_layers,
                   n_heads=n_heads, n_kv_heads=kv_heads, head_dim=head_dim,
                   hidden_dim=hf_config.intermediate_size, vocab_size=vocab,
                   norm_eps=float(hf_config.rms_norm_eps),
                   max_seq_len=hf_config.max_position_embeddings,
                   rope=rope_args_from_hf(hf_config),
                   enable_weight_tying=bool(getattr(hf_config, "tie_word_embeddings", False)),
                   pad_token_id=pad, qk_norm=cls.qk_norm, model_type=hf_config.model_type)
