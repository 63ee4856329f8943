"""Qwen3-MoE (model_type "qwen3_moe") as a Gatehouse Python adapter in Archon's layout."""

from gh_archon.qwen3_moe.spec import SPEC

__all__ = ["SPEC"]
