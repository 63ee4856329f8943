"""Qwen3's args in torchtitan's name (Qwen3ModelArgs, dense), read from transformers' parsed
Qwen3Config (gh_titan.common.args): per-head q/k RMSNorm before RoPE, ``enable_weight_tying``."""

from __future__ import annotations

from dataclasses import dataclass

from gh_titan.common.args import TitanArgs


@dataclass
class Qwen3ModelArgs(TitanArgs):
    qk_norm: bool = True
    model_type: str = "qwen3"
