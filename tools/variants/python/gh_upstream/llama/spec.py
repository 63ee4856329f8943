"""SPEC: transformers' LlamaForCausalLM (model_type "llama") with attn_implementation="sdpa"
(Gatehouse Python adapter contract v1; see gh_upstream.common)."""

from transformers import LlamaConfig, LlamaForCausalLM

from gh_upstream.common import UpstreamFamily

FAMILY = UpstreamFamily("llama", LlamaConfig, LlamaForCausalLM)
SPEC = FAMILY.spec("llama")

__all__ = ["SPEC"]
