"""The base classes of AReaL Archon's model families (areal/experimental/models/archon/base.py),
as this port writes them: args read from a transformers config object, a state-dict adapter
built from that object, a model whose forward takes a packed row."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class BaseModelArgs(ABC):
    # Archon's attention backend: "varlen" (flash attention over the packed row, its default)
    # or "sdpa".
    attn_type: str = "varlen"

    @staticmethod
    def _get_rope_theta(hf_config: Any, default: float = 10000.0) -> float:
        """rope_theta where transformers 5 keeps it (rope_parameters), else the attribute."""
        params = getattr(hf_config, "rope_parameters", None) or {}
        if "rope_theta" in params:
            return params["rope_theta"]
        return getattr(hf_config, "rope_theta", default)

    @classmethod
    @abstractmethod
    def from_hf_config(cls, hf_config: Any, is_critic: bool = False, **kwargs) -> "BaseModelArgs":
        ...


_LAYER_INDEX = re.compile(r"layers\.(\d+)\.")


class BaseStateDictAdapter(ABC):
    """Checkpoint <-> Archon names through a template table (``{}``: the layer index). An entry
    mapped to None is a checkpoint key Archon does not load (e.g. a saved rotary inv_freq); a key
    matching no template is skipped as well, as Archon's adapters do."""

    def __init__(self, model_config: Any, hf_assets_path: str | None = None):
        self.model_config = model_config
        self.hf_assets_path = hf_assets_path
        self.from_hf_map: dict[str, str | None] = {}
        self.enable_weight_tying = bool(getattr(model_config, "tie_word_embeddings", False))

    @property
    def to_hf_map(self) -> dict[str, str]:
        return {v: k for k, v in self.from_hf_map.items() if v is not None}

    @staticmethod
    def _convert(key: str, table: dict[str, str | None]) -> str | None:
        if key in table:
            return table[key]
        m = _LAYER_INDEX.search(key)
        if m is None:
            return None
        target = table.get(key[:m.start()] + "layers.{}." + key[m.end():])
        return None if target is None else target.replace("{}", m.group(1), 1)

    def from_hf(self, hf_state_dict: dict[str, Any]) -> dict[str, Any]:
        if self.enable_weight_tying and "lm_head.weight" not in hf_state_dict \
                and "model.embed_tokens.weight" in hf_state_dict:
            hf_state_dict["lm_head.weight"] = hf_state_dict["model.embed_tokens.weight"]
        out = {}
        for key, value in hf_state_dict.items():
            name = self._convert(key, self.from_hf_map)
            if name is not None:
                out[name] = value
        return out

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        table = self.to_hf_map
        out = {}
        for name, value in state_dict.items():
            if self.enable_weight_tying and name == "output.weight":
                continue
            key = self._convert(name, table)
            if key is not None:
                out[key] = value
        return out

    def convert_single_to_hf(self, name: str, tensor: torch.Tensor
                             ) -> list[tuple[str, torch.Tensor]]:
        # Activation-checkpoint and torch.compile wrappers add a path component.
        name = name.replace("._checkpoint_wrapped_module", "").replace("._orig_mod", "")
        key = self._convert(name, self.to_hf_map)
        return [] if key is None else [(key, tensor)]


class BaseArchonModel(nn.Module, ABC):
    @abstractmethod
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor,
                max_seqlen: int) -> torch.Tensor:
        ...

    @abstractmethod
    def init_buffers(self, buffer_device: torch.device | str) -> None:
        ...
