"""Checkpoint (Hugging Face) <-> gh_titan names, with the q/k permutation torchtitan's HF
state-dict adapter applies.

transformers' checkpoints hold each q/k head in the rotate-half layout: RoPE pair i is made of
head dims i and i + head_dim/2. torchtitan's complex RoPE pairs adjacent dims (2i, 2i+1), so
loading reorders the rows of every head of q_proj / k_proj from [pair halves] to [interleaved
pairs]; saving reorders them back. Qwen3's q_norm / k_norm weights act on the same head dims
after the projection, so the same within-head permutation applies to them. Both directions are
pure permutations: to_hf(from_hf(sd)) is bit-equal to sd.

Contract v1 (every key consumed, the tied alias verified, to_hf giving exactly the checkpoint's
keys) is held by the torchtitan shim around this adapter; an unknown key raises KeyError here.
"""

from __future__ import annotations

import torch

from gatehouse_adapter import KeyMap
from gh_titan.common.args import TitanArgs

_TOP_FROM_HF = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER_FROM_HF = {
    "model.layers.{}.input_layernorm.weight": "layers.{}.attention_norm.weight",
    "model.layers.{}.post_attention_layernorm.weight": "layers.{}.ffn_norm.weight",
    "model.layers.{}.self_attn.q_proj.weight": "layers.{}.attention.wq.weight",
    "model.layers.{}.self_attn.k_proj.weight": "layers.{}.attention.wk.weight",
    "model.layers.{}.self_attn.v_proj.weight": "layers.{}.attention.wv.weight",
    "model.layers.{}.self_attn.o_proj.weight": "layers.{}.attention.wo.weight",
    "model.layers.{}.mlp.gate_proj.weight": "layers.{}.feed_forward.w1.weight",
    "model.layers.{}.mlp.up_proj.weight": "layers.{}.feed_forward.w3.weight",
    "model.layers.{}.mlp.down_proj.weight": "layers.{}.feed_forward.w2.weight",
}
_QK_NORM_FROM_HF = {
    "model.layers.{}.self_attn.q_norm.weight": "layers.{}.attention.q_norm.weight",
    "model.layers.{}.self_attn.k_norm.weight": "layers.{}.attention.k_norm.weight",
}


def to_interleaved(w: torch.Tensor, n_heads: int, head_dim: int) -> torch.Tensor:
    """Rows (or, 1-D, elements) of n_heads heads from rotate-half to interleaved-pair order:
    new row 2i + c of a head is old row c * head_dim/2 + i."""
    rest = w.shape[1:]
    return (w.reshape(n_heads, 2, head_dim // 2, *rest).transpose(1, 2)
            .reshape(n_heads * head_dim, *rest).contiguous())


def to_rotate_half(w: torch.Tensor, n_heads: int, head_dim: int) -> torch.Tensor:
    """The inverse of to_interleaved."""
    rest = w.shape[1:]
    return (w.reshape(n_heads, head_dim // 2, 2, *rest).transpose(1, 2)
            .reshape(n_heads * head_dim, *rest).contiguous())


class TitanStateDictAdapter:
    """torchtitan's shape: ``(model_args, hf_assets_path)``, ``from_hf`` / ``to_hf``. As
    torchtitan's Qwen3 adapter, a tied model's ``from_hf`` answers ``output.weight`` beside the
    embedding (from lm_head.weight, or the embedding when the checkpoint omits it) and ``to_hf``
    skips it; a key without a template raises KeyError."""

    def __init__(self, model_args: TitanArgs, hf_assets_path: str | None = None):
        self.model_args = model_args
        self.hf_assets_path = hf_assets_path
        table = {**_TOP_FROM_HF, **_LAYER_FROM_HF}
        if model_args.qk_norm:
            table.update(_QK_NORM_FROM_HF)
        self.keys = KeyMap(table, n_layers=model_args.n_layers)
        a = model_args
        # Per model-side suffix: how many heads the tensor holds (permuted) .
        self._heads = {"attention.wq.weight": a.n_heads, "attention.wk.weight": a.n_kv_heads,
                       "attention.q_norm.weight": 1, "attention.k_norm.weight": 1}

    def _heads_of(self, name: str) -> int | None:
        return self._heads.get(name.split(".", 2)[-1]) if name.startswith("layers.") else None

    def from_hf(self, hf_state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.model_args.enable_weight_tying and "lm_head.weight" not in hf_state_dict:
            hf_state_dict["lm_head.weight"] = hf_state_dict["model.embed_tokens.weight"]
        out: dict[str, torch.Tensor] = {}
        unknown = []
        for key, value in hf_state_dict.items():
            name = self.keys.hf_to_model(key)
            if name is None:
                unknown.append(key)
                continue
            heads = self._heads_of(name)
            out[name] = value if heads is None else to_interleaved(value, heads,
                                                                   self.model_args.head_dim)
        if unknown:
            raise KeyError(f"checkpoint keys this {self.model_args.model_type} adapter does not "
                           f"map: {sorted(unknown)}")
        return out

    def to_hf(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for name, value in state_dict.items():
            if self.model_args.enable_weight_tying and name == "output.weight":
                continue
            key = self.keys.model_to_hf(name)
            if key is None:
                raise KeyError(f"model parameter {name!r} has no checkpoint name")
            heads = self._heads_of(name)
            out[key] = value if heads is None else to_rotate_half(value, heads,
                                                                  self.model_args.head_dim)
        return out
