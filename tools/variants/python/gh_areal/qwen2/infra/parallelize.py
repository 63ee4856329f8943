"""parallelize_qwen2: gh_areal.tensor_parallel (tensor parallelism, Archon's signature)."""

from gh_areal.tensor_parallel import parallelize_decoder as parallelize_qwen2

__all__ = ["parallelize_qwen2"]
