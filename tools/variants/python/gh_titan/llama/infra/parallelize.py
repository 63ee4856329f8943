"""parallelize_llama: gh_titan.common.parallelize (tensor parallelism, torchtitan's signature)."""

from gh_titan.common.parallelize import parallelize_decoder as parallelize_llama

__all__ = ["parallelize_llama"]
