"""Checkpoint (Hugging Face) names <-> a model's own parameter names, for state-dict adapters
(contract v1, "Weights").

:class:`KeyMap` is the template table frameworks write (AReaL's Archon and torchtitan both keep
``from_hf_map = {"model.layers.{}.self_attn.q_proj.weight": "layers.{}.attention.wq.weight",
...}``): ``{}`` stands for the layer index, carried over in both directions. Unlike the
frameworks' tables it maps every entry to a name (never None: contract v1 lets no key drop), and
with ``n_layers`` it refuses a layer index the model does not have.

:func:`check_tied_alias` is the contract's rule for a tied checkpoint that holds
``lm_head.weight`` all the same.
"""

from __future__ import annotations

import re

import torch

__all__ = ["KeyMap", "check_tied_alias", "layer_of"]

_LAYER = re.compile(r"(?<=layers\.)(\d+)(?=\.)")


def layer_of(key: str) -> int | None:
    """The first layer index in a key (``...layers.N....``), or None."""
    m = _LAYER.search(key)
    return None if m is None else int(m.group(1))


class KeyMap:
    """Bidirectional template map; the layer index (the first ``layers.N.``) is carried over.

    from_hf: ``{hf template: model template}`` with ``{}`` for the layer index.
    n_layers: when given, a key whose layer index is ``>= n_layers`` maps to nothing.
    """

    def __init__(self, from_hf: dict[str, str], n_layers: int | None = None):
        bad = sorted(k for k, v in from_hf.items() if not isinstance(v, str))
        if bad:
            raise ValueError(f"KeyMap entries must map to a name (contract v1 drops no key): "
                             f"{bad}")
        self.from_hf_map = dict(from_hf)
        self.to_hf_map = {v: k for k, v in from_hf.items()}
        if len(self.to_hf_map) != len(self.from_hf_map):
            raise ValueError("KeyMap: two checkpoint templates map to one model template")
        self.n_layers = n_layers

    def _convert(self, key: str, table: dict[str, str]) -> str | None:
        if key in table:
            return table[key]
        m = _LAYER.search(key)
        if m is None or (self.n_layers is not None and int(m.group(1)) >= self.n_layers):
            return None
        target = table.get(key[:m.start()] + "{}" + key[m.end():])
        return None if target is None else target.replace("{}", m.group(1), 1)

    def hf_to_model(self, key: str) -> str | None:
        return self._convert(key, self.from_hf_map)

    def model_to_hf(self, key: str) -> str | None:
        return self._convert(key, self.to_hf_map)


def check_tied_alias(hf_state_dict: dict[str, torch.Tensor], alias: str = "lm_head.weight",
                     target: str = "model.embed_tokens.weight") -> None:
    """A tied checkpoint that holds ``alias`` all the same: it must equal ``target`` (else the
    checkpoint asks for two different tensors where the model has one, and upstream would
    silently keep the embedding). Raises ValueError naming both."""
    lm, emb = hf_state_dict[alias], hf_state_dict.get(target)
    if emb is None or lm.shape != emb.shape or not torch.equal(lm, emb.to(lm.dtype)):
        raise ValueError(f"tie_word_embeddings is true but the checkpoint's {alias} differs "
                         f"from {target}")
