"""SPEC: transformers' Qwen3ForCausalLM (model_type "qwen3") with attn_implementation="sdpa"
(Gatehouse Python adapter contract v1; see gh_upstream.common)."""

from transformers import Qwen3Config, Qwen3ForCausalLM

from gh_upstream.common import UpstreamFamily


def _min_sliding_window(cfg) -> int:
    """The window of Qwen3's sliding layers (layer_types), 0 when none slides."""
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None) or []
    return int(window) if window and "sliding_attention" in types else 0


FAMILY = UpstreamFamily("qwen3", Qwen3Config, Qwen3ForCausalLM, sliding=_min_sliding_window)
SPEC = FAMILY.spec("qwen3")

__all__ = ["SPEC"]
