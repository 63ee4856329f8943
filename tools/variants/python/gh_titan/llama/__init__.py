"""Llama 3 as torchtitan writes it (gh_titan), with its TrainSpec (``get_train_spec()``, as
torchtitan/models/llama3/__init__.py). The Gatehouse SPEC is in gh_titan.llama.spec."""

from gh_titan.common.train_spec import TrainSpec
from gh_titan.llama.infra.parallelize import parallelize_llama
from gh_titan.llama.model.args import TransformerModelArgs
from gh_titan.llama.model.model import Transformer
from gh_titan.llama.model.state_dict_adapter import Llama3StateDictAdapter

llama3_args = {
    "debugmodel": TransformerModelArgs(dim=256, n_layers=6, n_heads=16, n_kv_heads=16,
                                       head_dim=16, hidden_dim=768, vocab_size=2048),
}


def get_train_spec() -> TrainSpec:
    return TrainSpec(model_cls=Transformer, model_args=llama3_args,
                     parallelize_fn=parallelize_llama, state_dict_adapter=Llama3StateDictAdapter)


def __getattr__(name):
    if name == "SPEC":
        from gh_titan.llama.spec import SPEC
        return SPEC
    raise AttributeError(name)
