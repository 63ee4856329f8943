"""AReaL's Archon models (github.com/inclusionAI/AReaL, areal/experimental/models/archon) ported
in Archon's own shape -- args read from a transformers config object (``from_hf_config``), a
model whose forward requires ``cu_seqlens``, ``enable_weight_tying`` applied by the
parallelize_fn, a state-dict adapter built from the config object, a ``ModelSpec`` per family --
and presented to Gatehouse through ``gatehouse_adapter.frameworks.archon`` by a short spec
module per family. Their numerical choices are Archon's: correct implementations that do not
follow transformers op for op, for the gates' false-FAIL suite (tools/variants/manifest.json).

Families: ``gh_areal.qwen2`` (model_type "qwen2") and ``gh_areal.qwen3`` (dense "qwen3"); each
package holds Archon's ``QWEN*_SPEC`` and its ``spec`` module Gatehouse's ``SPEC``.

Imports torch and gatehouse_adapter; the shim reads config.json through transformers.
"""

FAMILIES = ("qwen2", "qwen3")
