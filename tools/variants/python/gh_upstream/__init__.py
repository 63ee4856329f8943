"""Gatehouse Python adapters (contract v1, gatehouse_adapter) that run transformers' own model
classes with scaled_dot_product_attention instead of the bundle's eager attention: correct by
construction, for the gates' false-FAIL suite (tools/variants/manifest.json).

Families: ``gh_upstream.llama.SPEC`` (LlamaForCausalLM), ``gh_upstream.qwen3.SPEC``
(Qwen3ForCausalLM). Imports torch, transformers and gatehouse_adapter only.
"""

FAMILIES = ("llama", "qwen3")
