"""Llama 3 as torchtitan writes it (torchtitan/models/llama3/model/model.py, ``Transformer``):
the shared gh_titan decoder (gh_titan.common.layers)."""

from __future__ import annotations

from gh_titan.common.layers import Decoder
from gh_titan.llama.model.args import TransformerModelArgs


class Transformer(Decoder):
    def __init__(self, model_args: TransformerModelArgs):
        if model_args.qk_norm:
            raise ValueError("Llama 3 has no q/k norms")
        super().__init__(model_args)
