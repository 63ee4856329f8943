"""Checkpoint <-> model names for Qwen3 (torchtitan/models/qwen3/model/state_dict_adapter.py,
dense): gh_titan.common.state_dict, q/k rows and q/k norm weights permuted into interleaved RoPE
pairs."""

from gh_titan.common.state_dict import TitanStateDictAdapter


class Qwen3StateDictAdapter(TitanStateDictAdapter):
    pass


__all__ = ["Qwen3StateDictAdapter"]
