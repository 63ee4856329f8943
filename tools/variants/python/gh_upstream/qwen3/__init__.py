"""transformers' own qwen3 model with attn_implementation="sdpa" (contract v1)."""

from gh_upstream.qwen3.spec import SPEC

__all__ = ["SPEC"]
