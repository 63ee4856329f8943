"""Checkpoint <-> model names for Llama 3 (torchtitan/models/llama3/model/state_dict_adapter.py):
gh_titan.common.state_dict, q/k rows permuted into interleaved RoPE pairs."""

from gh_titan.common.state_dict import TitanStateDictAdapter


class Llama3StateDictAdapter(TitanStateDictAdapter):
    pass


LlamaStateDictAdapter = Llama3StateDictAdapter   # the name this path had

__all__ = ["Llama3StateDictAdapter", "LlamaStateDictAdapter"]
