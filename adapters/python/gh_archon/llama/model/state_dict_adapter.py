"""Checkpoint <-> model names for Llama (contract v1: every checkpoint key consumed, nothing
invented; tied embeddings counted once). No weight permutation: transformers' checkpoints
already hold q/k rows in the rotate-half layout this model uses."""

from __future__ import annotations

import torch

from gatehouse_adapter import BaseStateDictAdapter
from gh_archon.common.names import DENSE_FROM_HF, KeyMap, tied_lm_head
from gh_archon.llama.model.args import LlamaModelArgs


class LlamaStateDictAdapter(BaseStateDictAdapter):
    def __init__(self, args: LlamaModelArgs):
        self.args = args
        self.keys = KeyMap(DENSE_FROM_HF)
        self.tied = args.tie_word_embeddings
        # Whether the checkpoint read by from_hf held lm_head.weight although tied (to_hf then
        # writes it back, so the round trip gives the checkpoint's own keys).
        self._tied_lm_head_seen = False

    def from_hf(self, hf_state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        unknown = []
        for key, value in hf_state_dict.items():
            if self.tied and key == "lm_head.weight":
                tied_lm_head(hf_state_dict)   # an alias of the embedding: verified, consumed
                self._tied_lm_head_seen = True
                continue
            name = self.keys.hf_to_model(key)
            if name is None:
                unknown.append(key)
                continue
            out[name] = value
        if unknown:
            raise KeyError(f"checkpoint keys this llama adapter does not map: {sorted(unknown)}")
        return out

    def to_hf(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for name, value in state_dict.items():
            if self.tied and name == "output.weight":
                continue  # the embedding (state_dict() lists the tied alias too)
            key = self.keys.model_to_hf(name)
            if key is None:
                raise KeyError(f"model parameter {name!r} has no checkpoint name")
            out[key] = value
        if self.tied and self._tied_lm_head_seen and "model.embed_tokens.weight" in out:
            out["lm_head.weight"] = out["model.embed_tokens.weight"]
        return out
