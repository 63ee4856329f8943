"""Checkpoint (Hugging Face) <-> AReaL names for dense Qwen3, as AReaL's Qwen3StateDictAdapter
maps them (areal/experimental/models/archon/qwen3/model/state_dict_adapter.py; no weight
permutation: the checkpoint's q/k rows are already in the rotate-half layout AReaL's RoPE uses).

Contract v1 differs from AReaL in two places: every checkpoint key must be consumed (AReaL drops
a rotary inv_freq key and any key it does not know; here such a key raises), and a tied model
has one embedding parameter (AReaL's from_hf copies embed_tokens into output.weight; here a
checkpoint's lm_head.weight is verified equal to the embedding and consumed).
"""

from __future__ import annotations

import re

import torch

from gatehouse_adapter import BaseStateDictAdapter
from gh_areal.qwen3.model.args import Qwen3ModelArgs

FROM_HF = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.layers.{}.self_attn.q_proj.weight": "layers.{}.attention.wq.weight",
    "model.layers.{}.self_attn.k_proj.weight": "layers.{}.attention.wk.weight",
    "model.layers.{}.self_attn.v_proj.weight": "layers.{}.attention.wv.weight",
    "model.layers.{}.self_attn.o_proj.weight": "layers.{}.attention.wo.weight",
    "model.layers.{}.self_attn.q_norm.weight": "layers.{}.attention.q_norm.weight",
    "model.layers.{}.self_attn.k_norm.weight": "layers.{}.attention.k_norm.weight",
    "model.layers.{}.mlp.gate_proj.weight": "layers.{}.feed_forward.w1.weight",
    "model.layers.{}.mlp.up_proj.weight": "layers.{}.feed_forward.w3.weight",
    "model.layers.{}.mlp.down_proj.weight": "layers.{}.feed_forward.w2.weight",
    "model.layers.{}.input_layernorm.weight": "layers.{}.attention_norm.weight",
    "model.layers.{}.post_attention_layernorm.weight": "layers.{}.ffn_norm.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
}
TO_HF = {v: k for k, v in FROM_HF.items()}

_LAYER = re.compile(r"layers\.(\d+)\.")


def _convert(key: str, table: dict[str, str], n_layers: int) -> str | None:
    if key in table:
        return table[key]
    m = _LAYER.search(key)
    if m is None or int(m.group(1)) >= n_layers:
        return None
    target = table.get(key[:m.start()] + "layers.{}." + key[m.end():])
    return None if target is None else target.replace("{}", m.group(1), 1)


class Qwen3StateDictAdapter(BaseStateDictAdapter):
    def __init__(self, args: Qwen3ModelArgs):
        self.args = args
        self.tied = args.enable_weight_tying
        # Whether the checkpoint read by from_hf held lm_head.weight although tied (to_hf then
        # writes it back: the round trip gives the checkpoint's own keys).
        self._tied_lm_head_seen = False

    def from_hf(self, hf_state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        unknown = []
        for key, value in hf_state_dict.items():
            if self.tied and key == "lm_head.weight":
                emb = hf_state_dict.get("model.embed_tokens.weight")
                if emb is None or emb.shape != value.shape or not torch.equal(
                        value, emb.to(value.dtype)):
                    raise ValueError("tie_word_embeddings is true but the checkpoint's "
                                     "lm_head.weight differs from model.embed_tokens.weight")
                self._tied_lm_head_seen = True
                continue
            name = _convert(key, FROM_HF, self.args.n_layers)
            if name is None:
                unknown.append(key)
                continue
            out[name] = value
        if unknown:
            raise KeyError(f"checkpoint keys this AReaL qwen3 port does not map: {sorted(unknown)}")
        return out

    def to_hf(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for name, value in state_dict.items():
            if self.tied and name == "output.weight":
                continue  # the embedding (state_dict() lists the tied alias too)
            key = _convert(name, TO_HF, self.args.n_layers)
            if key is None:
                raise KeyError(f"model parameter {name!r} has no checkpoint name")
            out[key] = value
        if self.tied and self._tied_lm_head_seen and "model.embed_tokens.weight" in out:
            out["lm_head.weight"] = out["model.embed_tokens.weight"]
        return out

    def convert_single_to_hf(self, name: str, tensor: torch.Tensor
                             ) -> list[tuple[str, torch.Tensor]]:
        # AReaL strips activation-checkpoint and torch.compile wrapper prefixes first.
        name = name.replace("._checkpoint_wrapped_module", "").replace("._orig_mod", "")
        return list(self.to_hf({name: tensor}).items())
