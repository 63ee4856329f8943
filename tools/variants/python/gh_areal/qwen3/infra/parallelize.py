"""parallelize_qwen3: gh_areal.tensor_parallel (tensor parallelism, Archon's signature; the
per-head q/k norms SequenceParallel over their heads)."""

from gh_areal.tensor_parallel import parallelize_decoder as parallelize_qwen3

__all__ = ["parallelize_qwen3"]
