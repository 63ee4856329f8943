"""Qwen2 (model_type "qwen2") as AReaL's Archon writes it, and its Archon ModelSpec (QWEN2_SPEC,
areal/experimental/models/archon/qwen2/spec.py). The Gatehouse SPEC is in gh_areal.qwen2.spec."""

from gh_areal.model_spec import ModelSpec
from gh_areal.qwen2.infra.parallelize import parallelize_qwen2
from gh_areal.qwen2.model.args import Qwen2ModelArgs
from gh_areal.qwen2.model.model import Qwen2Model
from gh_areal.qwen2.model.state_dict_adapter import Qwen2StateDictAdapter

QWEN2_SPEC = ModelSpec(
    name="Qwen2",
    model_class=Qwen2Model,
    model_args_class=Qwen2ModelArgs,
    state_dict_adapter_class=Qwen2StateDictAdapter,
    parallelize_fn=parallelize_qwen2,
    supported_model_types=frozenset({"qwen2"}),
)

__all__ = ["QWEN2_SPEC", "Qwen2Model", "Qwen2ModelArgs", "Qwen2StateDictAdapter",
           "parallelize_qwen2"]


def __getattr__(name):
    if name == "SPEC":   # Gatehouse's, from the spec module (which imports this package)
        from gh_areal.qwen2.spec import SPEC
        return SPEC
    raise AttributeError(name)
