"""SPEC for the gh_titan qwen3 adapter (Gatehouse Python adapter contract v1): Qwen3 as torchtitan
writes it. No tensor-parallel plan."""

from gatehouse_adapter import ModelSpec
from gh_titan.common.layers import gate_facts
from gh_titan.qwen3.model.args import MODEL_TYPES, args_from_hf_config, config_accounting
from gh_titan.qwen3.model.model import build_model
from gh_titan.qwen3.model.state_dict_adapter import Qwen3StateDictAdapter

SPEC = ModelSpec(
    name="qwen3",
    model_types=MODEL_TYPES,
    args_from_hf_config=args_from_hf_config,
    config_accounting=config_accounting,
    build_model=build_model,
    state_dict_adapter=Qwen3StateDictAdapter,
    parallelize=None,
    gate_facts=gate_facts,
)

__all__ = ["SPEC"]
