"""A Gatehouse Python adapter (contract v1, gatehouse_adapter) that ports AReaL's Archon models
as their authors wrote them (github.com/inclusionAI/AReaL, areal/experimental/models/archon),
keeping their numerical choices: a correct implementation that does not follow transformers op
for op, for the gates' false-FAIL suite (tools/variants/manifest.json).

Families: ``gh_areal.qwen3.SPEC`` (dense Qwen3, model_type "qwen3").

Stands alone: imports torch and gatehouse_adapter only.
"""

FAMILIES = ("qwen3",)
