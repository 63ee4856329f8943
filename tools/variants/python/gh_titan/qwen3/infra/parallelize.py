"""parallelize_qwen3: gh_titan.common.parallelize (tensor parallelism, torchtitan's signature;
the per-head q/k norms SequenceParallel over their heads)."""

from gh_titan.common.parallelize import parallelize_decoder as parallelize_qwen3

__all__ = ["parallelize_qwen3"]
