"""Llama 3's args in torchtitan's name (TransformerModelArgs), read from transformers' parsed
LlamaConfig (gh_titan.common.args). Unlike torchtitan's Llama 3 it has a tie flag
(``enable_weight_tying``, as torchtitan's Qwen3): Llama 3.2 and SmolLM2 checkpoints are tied."""

from __future__ import annotations

from dataclasses import dataclass

from gh_titan.common.args import TitanArgs


@dataclass
class TransformerModelArgs(TitanArgs):
    qk_norm: bool = False
    model_type: str = "llama"
