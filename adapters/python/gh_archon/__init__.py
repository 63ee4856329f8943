"""Gatehouse Python-lane reference adapters in AReaL Archon's layout (args / model /
state_dict_adapter / parallelize), contract version 1 (gatehouse_adapter).

Each family package exposes SPEC: ``gh_archon.llama.SPEC``, ``gh_archon.qwen3_moe.SPEC``.
"""

import importlib

FAMILIES = ("llama", "qwen3_moe")


def spec(name: str):
    """The ModelSpec of family `name`."""
    if name not in FAMILIES:
        raise KeyError(f"unknown family {name!r} (known: {', '.join(FAMILIES)})")
    return importlib.import_module(f"gh_archon.{name}").SPEC


def spec_for_model_type(model_type: str):
    """The ModelSpec serving a Hugging Face model_type, or None."""
    for name in FAMILIES:
        s = spec(name)
        if model_type in s.model_types:
            return s
    return None
