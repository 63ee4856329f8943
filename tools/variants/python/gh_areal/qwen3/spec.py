"""SPEC for the gh_areal qwen3 adapter (Gatehouse Python adapter contract v1): AReaL's Archon
Qwen3 model as its authors wrote it. No tensor-parallel plan."""

from gatehouse_adapter import ModelSpec
from gh_areal.qwen3.model.args import MODEL_TYPES, Qwen3ModelArgs, gate_facts
from gh_areal.qwen3.model.model import build_model
from gh_areal.qwen3.model.state_dict_adapter import Qwen3StateDictAdapter

SPEC = ModelSpec(
    name="qwen3",
    model_types=MODEL_TYPES,
    args_from_hf_config=Qwen3ModelArgs.from_hf_config,
    config_accounting=Qwen3ModelArgs.config_accounting,
    build_model=build_model,
    state_dict_adapter=Qwen3StateDictAdapter,
    parallelize=None,
    gate_facts=gate_facts,
)

__all__ = ["SPEC"]
