"""Llama (model_type "llama") as a Gatehouse Python adapter in Archon's layout."""

from gh_archon.llama.spec import SPEC

__all__ = ["SPEC"]
