"""Qwen3 as torchtitan writes it (torchtitan/models/qwen3/model/model.py, ``Qwen3Model``, dense):
the shared gh_titan decoder (gh_titan.common.layers) with per-head q/k RMSNorm before RoPE."""

from __future__ import annotations

from gh_titan.common.layers import Decoder
from gh_titan.qwen3.model.args import Qwen3ModelArgs


class Qwen3Model(Decoder):
    def __init__(self, model_args: Qwen3ModelArgs):
        if not model_args.qk_norm:
            raise ValueError("Qwen3 applies q/k norms")
        super().__init__(model_args)
