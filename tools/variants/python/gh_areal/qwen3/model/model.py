"""Dense Qwen3 as AReaL's Archon computes it (areal/experimental/models/archon/qwen3/model/
model.py): Qwen2's decoder (gh_areal.qwen2.model.model, the same RoPE, attention backends,
norms and packed-row forward that requires cu_seqlens) without biases and with per-head q/k
RMSNorm before RoPE. Parameter names add layers.N.attention.{q,k}_norm.weight."""

from __future__ import annotations

from gh_areal.qwen2.model.model import Qwen2Model


class Qwen3Model(Qwen2Model):
    def __init__(self, model_args):
        if not model_args.qk_norm or model_args.attention_bias:
            raise ValueError("Qwen3Model computes q/k norms and no attention bias")
        super().__init__(model_args)
