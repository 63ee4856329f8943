"""Checkpoint <-> model names for Qwen3: gh_titan.common.state_dict (q/k rows and q/k norm
weights permuted into interleaved RoPE pairs)."""

from gh_titan.common.state_dict import TitanStateDictAdapter

Qwen3StateDictAdapter = TitanStateDictAdapter

__all__ = ["Qwen3StateDictAdapter"]
