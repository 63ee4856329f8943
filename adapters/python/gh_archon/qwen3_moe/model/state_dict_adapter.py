"""Checkpoint <-> model names for Qwen3-MoE (contract v1: every checkpoint key consumed, nothing
invented; tied embeddings counted once).

Experts: save_pretrained writes one 2-D tensor per expert and projection
(model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight); from_hf stacks them into
layers.L.moe.experts.w13 [E, 2I, dim] (gate rows then up rows) and .w2 [E, dim, I], and needs
every expert of every projection. Upstream's in-memory fused form
(model.layers.L.mlp.experts.gate_up_proj [E, 2I, dim] / .down_proj [E, dim, I]) is read too; to_hf
writes back the form from_hf read (per-expert by default).
"""

from __future__ import annotations

import re

import torch

from gatehouse_adapter import BaseStateDictAdapter
from gh_archon.common.names import DENSE_FROM_HF, KeyMap, tied_lm_head
from gh_archon.qwen3_moe.model.args import Qwen3MoeModelArgs

_FROM_HF = dict(DENSE_FROM_HF)
_FROM_HF.update({
    "model.layers.{}.self_attn.q_norm.weight": "layers.{}.attention.q_norm.weight",
    "model.layers.{}.self_attn.k_norm.weight": "layers.{}.attention.k_norm.weight",
    "model.layers.{}.mlp.gate.weight": "layers.{}.moe.router.gate.weight",
})
for _b in ("gate_proj", "up_proj", "down_proj"):  # Qwen3MoeMLP has no biases
    _FROM_HF.pop(f"model.layers.{{}}.mlp.{_b}.bias")

_EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")
_FUSED = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)")
_MODEL_EXPERT = re.compile(r"layers\.(\d+)\.moe\.experts\.(w13|w2)")


class Qwen3MoeStateDictAdapter(BaseStateDictAdapter):
    def __init__(self, args: Qwen3MoeModelArgs):
        self.args = args
        self.keys = KeyMap(_FROM_HF)
        self.tied = args.tie_word_embeddings
        self._tied_lm_head_seen = False
        self._fused_layers: set[int] = set()   # layers whose experts the checkpoint held fused

    def from_hf(self, hf_state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        unknown = []
        per_expert: dict[int, dict[str, dict[int, torch.Tensor]]] = {}
        for key, value in hf_state_dict.items():
            if self.tied and key == "lm_head.weight":
                tied_lm_head(hf_state_dict)
                self._tied_lm_head_seen = True
                continue
            m = _EXPERT.fullmatch(key)
            if m is not None:
                layer, expert, proj = int(m.group(1)), int(m.group(2)), m.group(3)
                per_expert.setdefault(layer, {}).setdefault(proj, {})[expert] = value
                continue
            m = _FUSED.fullmatch(key)
            if m is not None:
                layer = int(m.group(1))
                name = "w13" if m.group(2) == "gate_up_proj" else "w2"
                out[f"layers.{layer}.moe.experts.{name}"] = value
                self._fused_layers.add(layer)
                continue
            name = self.keys.hf_to_model(key)
            if name is None:
                unknown.append(key)
                continue
            out[name] = value
        if unknown:
            raise KeyError(f"checkpoint keys this qwen3_moe adapter does not map: {sorted(unknown)}")
        for layer, projs in sorted(per_expert.items()):
            if layer in self._fused_layers:
                raise ValueError(f"layer {layer} holds its experts both fused and per expert")
            n = self.args.num_experts
            for proj in ("gate_proj", "up_proj", "down_proj"):
                got = sorted(projs.get(proj, {}))
                if got != list(range(n)):
                    missing = sorted(set(range(n)) - set(got))
                    extra = sorted(set(got) - set(range(n)))
                    raise KeyError(f"layer {layer} {proj}: experts missing {missing}, unexpected "
                                   f"{extra} (num_experts = {n})")
            gate = torch.stack([projs["gate_proj"][e] for e in range(n)])
            up = torch.stack([projs["up_proj"][e] for e in range(n)])
            out[f"layers.{layer}.moe.experts.w13"] = torch.cat([gate, up], dim=1)
            out[f"layers.{layer}.moe.experts.w2"] = torch.stack(
                [projs["down_proj"][e] for e in range(n)])
        return out

    def _experts_to_hf(self, layer: int, name: str, value: torch.Tensor
                       ) -> list[tuple[str, torch.Tensor]]:
        if layer in self._fused_layers:
            proj = "gate_up_proj" if name == "w13" else "down_proj"
            return [(f"model.layers.{layer}.mlp.experts.{proj}", value)]
        out = []
        if name == "w13":
            half = value.shape[1] // 2
            for e in range(value.shape[0]):
                out.append((f"model.layers.{layer}.mlp.experts.{e}.gate_proj.weight",
                            value[e, :half].contiguous()))
                out.append((f"model.layers.{layer}.mlp.experts.{e}.up_proj.weight",
                            value[e, half:].contiguous()))
        else:
            for e in range(value.shape[0]):
                out.append((f"model.layers.{layer}.mlp.experts.{e}.down_proj.weight",
                            value[e].contiguous()))
        return out

    def to_hf(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for name, value in state_dict.items():
            if self.tied and name == "output.weight":
                continue
            m = _MODEL_EXPERT.fullmatch(name)
            if m is not None:
                out.update(self._experts_to_hf(int(m.group(1)), m.group(2), value))
                continue
            key = self.keys.model_to_hf(name)
            if key is None:
                raise KeyError(f"model parameter {name!r} has no checkpoint name")
            out[key] = value
        if self.tied and self._tied_lm_head_seen and "model.embed_tokens.weight" in out:
            out["lm_head.weight"] = out["model.embed_tokens.weight"]
        return out
