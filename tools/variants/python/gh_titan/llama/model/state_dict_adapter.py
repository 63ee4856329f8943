"""Checkpoint <-> model names for Llama: gh_titan.common.state_dict (q/k rows permuted into interleaved RoPE pairs)."""

from gh_titan.common.state_dict import TitanStateDictAdapter

LlamaStateDictAdapter = TitanStateDictAdapter

__all__ = ["LlamaStateDictAdapter"]
