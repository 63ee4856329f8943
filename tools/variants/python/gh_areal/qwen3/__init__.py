"""Dense Qwen3 (model_type "qwen3") as AReaL's Archon writes it, and its Archon ModelSpec
(QWEN3_SPEC, areal/experimental/models/archon/qwen3/spec.py). The Gatehouse SPEC is in
gh_areal.qwen3.spec."""

from gh_areal.model_spec import ModelSpec
from gh_areal.qwen3.infra.parallelize import parallelize_qwen3
from gh_areal.qwen3.model.args import Qwen3ModelArgs
from gh_areal.qwen3.model.model import Qwen3Model
from gh_areal.qwen3.model.state_dict_adapter import Qwen3StateDictAdapter

QWEN3_SPEC = ModelSpec(
    name="Qwen3",
    model_class=Qwen3Model,
    model_args_class=Qwen3ModelArgs,
    state_dict_adapter_class=Qwen3StateDictAdapter,
    parallelize_fn=parallelize_qwen3,
    supported_model_types=frozenset({"qwen3"}),
)

__all__ = ["QWEN3_SPEC", "Qwen3Model", "Qwen3ModelArgs", "Qwen3StateDictAdapter",
           "parallelize_qwen3"]


def __getattr__(name):
    if name == "SPEC":   # Gatehouse's, from the spec module (which imports this package)
        from gh_areal.qwen3.spec import SPEC
        return SPEC
    raise AttributeError(name)
