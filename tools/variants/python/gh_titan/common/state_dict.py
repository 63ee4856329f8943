"""Checkpoint (Hugging Face) <-> gh_titan names, with the q/k permutation torchtitan's HF
state-dict adapter applies.

transformers' checkpoints hold each q/k head in the rotate-half layout: RoPE pair i is made of
head dims i and i + head_dim/2. torchtitan's complex RoPE pairs adjacent dims (2i, 2i+1), so
loading reorders the rows of every head of q_proj / k_proj from [pair halves] to [interleaved
pairs]; saving reorders them back. Qwen3's q_norm / k_norm weights act on the same head dims
after the projection, so the same within-head permutation applies to them. Both directions are
pure permutations: to_hf(from_hf(sd)) is bit-equal to sd.

Contract v1: every checkpoint key is consumed (a tied lm_head.weight only when equal to the
embedding), an unknown key raises KeyError naming it, to_hf gives back exactly the checkpoint's
keys.
"""

from __future__ import annotations

import re

import torch

from gatehouse_adapter import BaseStateDictAdapter
from gh_titan.common.layers import TitanArgs

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_MODEL_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")

_TOP_FROM_HF = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER_FROM_HF = {
    "input_layernorm.weight": "attention_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attention.wq.weight",
    "self_attn.k_proj.weight": "attention.wk.weight",
    "self_attn.v_proj.weight": "attention.wv.weight",
    "self_attn.o_proj.weight": "attention.wo.weight",
    "mlp.gate_proj.weight": "feed_forward.w1.weight",
    "mlp.up_proj.weight": "feed_forward.w3.weight",
    "mlp.down_proj.weight": "feed_forward.w2.weight",
}
_QK_NORM_FROM_HF = {
    "self_attn.q_norm.weight": "attention.q_norm.weight",
    "self_attn.k_norm.weight": "attention.k_norm.weight",
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


class TitanStateDictAdapter(BaseStateDictAdapter):
    def __init__(self, args: TitanArgs):
        self.args = args
        self.tied = args.tie_word_embeddings
        self.layer_from_hf = dict(_LAYER_FROM_HF)
        if args.qk_norm:
            self.layer_from_hf.update(_QK_NORM_FROM_HF)
        self.layer_to_hf = {v: k for k, v in self.layer_from_hf.items()}
        self.top_to_hf = {v: k for k, v in _TOP_FROM_HF.items()}
        # Whether the checkpoint read by from_hf held lm_head.weight although tied (to_hf then
        # writes it back: the round trip gives the checkpoint's own keys).
        self._tied_lm_head_seen = False

    # Per model-side suffix: how many heads the tensor holds (None: not permuted).
    def _heads(self, model_suffix: str) -> int | None:
        a = self.args
        return {"attention.wq.weight": a.n_heads, "attention.wk.weight": a.n_kv_heads,
                "attention.q_norm.weight": 1, "attention.k_norm.weight": 1}.get(model_suffix)

    def from_hf(self, hf_state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        unknown = []
        for key, value in hf_state_dict.items():
            if key == "lm_head.weight" and self.tied:
                embed = hf_state_dict.get("model.embed_tokens.weight")
                if embed is None or embed.shape != value.shape or not torch.equal(
                        embed, value.to(embed.dtype)):
                    raise ValueError("tie_word_embeddings is true but the checkpoint's "
                                     "lm_head.weight differs from model.embed_tokens.weight")
                self._tied_lm_head_seen = True
                continue
            if key in _TOP_FROM_HF:
                out[_TOP_FROM_HF[key]] = value
                continue
            m = _LAYER.match(key)
            suffix = self.layer_from_hf.get(m.group(2)) if m else None
            if suffix is None or int(m.group(1)) >= self.args.n_layers:
                unknown.append(key)
                continue
            heads = self._heads(suffix)
            if heads is not None:
                value = to_interleaved(value, heads, self.args.head_dim)
            out[f"layers.{m.group(1)}.{suffix}"] = value
        if unknown:
            raise KeyError(f"checkpoint keys this {self.args.model_type} adapter does not map: "
                           f"{sorted(unknown)}")
        return out

    def to_hf(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for name, value in state_dict.items():
            if name == "output.weight" and self.tied:
                continue  # the embedding (state_dict() lists the tied alias too)
            if name in self.top_to_hf:
                out[self.top_to_hf[name]] = value
                continue
            m = _MODEL_LAYER.match(name)
            key = self.layer_to_hf.get(m.group(2)) if m else None
            if key is None:
                raise KeyError(f"model parameter {name!r} has no checkpoint name")
            heads = self._heads(m.group(2))
            if heads is not None:
                value = to_rotate_half(value, heads, self.args.head_dim)
            out[f"model.layers.{m.group(1)}.{key}"] = value
        if self.tied and self._tied_lm_head_seen and "model.embed_tokens.weight" in out:
            out["lm_head.weight"] = out["model.embed_tokens.weight"]
        return out
