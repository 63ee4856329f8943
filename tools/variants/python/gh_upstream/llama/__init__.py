"""transformers' own llama model with attn_implementation="sdpa" (contract v1)."""

from gh_upstream.llama.spec import SPEC

__all__ = ["SPEC"]
