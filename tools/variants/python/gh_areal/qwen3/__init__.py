"""Dense Qwen3 (model_type "qwen3") as AReaL's Archon computes it, as a Gatehouse Python
adapter (contract v1)."""

from gh_areal.qwen3.spec import SPEC

__all__ = ["SPEC"]
