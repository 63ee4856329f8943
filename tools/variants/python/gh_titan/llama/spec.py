"""SPEC for the gh_titan llama adapter (Gatehouse Python adapter contract v1): Llama as torchtitan
writes it. No tensor-parallel plan."""

from gatehouse_adapter import ModelSpec
from gh_titan.common.layers import gate_facts
from gh_titan.llama.model.args import MODEL_TYPES, args_from_hf_config, config_accounting
from gh_titan.llama.model.model import build_model
from gh_titan.llama.model.state_dict_adapter import LlamaStateDictAdapter

SPEC = ModelSpec(
    name="llama",
    model_types=MODEL_TYPES,
    args_from_hf_config=args_from_hf_config,
    config_accounting=config_accounting,
    build_model=build_model,
    state_dict_adapter=LlamaStateDictAdapter,
    parallelize=None,
    gate_facts=gate_facts,
)

__all__ = ["SPEC"]
