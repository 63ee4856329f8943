"""Qwen3 (dense) as torchtitan writes it (gh_titan), with its TrainSpec (``get_train_spec()``, as
torchtitan/models/qwen3/__init__.py). The Gatehouse SPEC is in gh_titan.qwen3.spec."""

from gh_titan.common.train_spec import TrainSpec
from gh_titan.qwen3.infra.parallelize import parallelize_qwen3
from gh_titan.qwen3.model.args import Qwen3ModelArgs
from gh_titan.qwen3.model.model import Qwen3Model
from gh_titan.qwen3.model.state_dict_adapter import Qwen3StateDictAdapter

qwen3_args = {
    "0.6B": Qwen3ModelArgs(dim=1024, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128,
                           hidden_dim=3072, vocab_size=151936, norm_eps=1e-6,
                           max_seq_len=4096, enable_weight_tying=True),
}


def get_train_spec() -> TrainSpec:
    return TrainSpec(model_cls=Qwen3Model, model_args=qwen3_args,
                     parallelize_fn=parallelize_qwen3, state_dict_adapter=Qwen3StateDictAdapter)


def __getattr__(name):
    if name == "SPEC":
        from gh_titan.qwen3.spec import SPEC
        return SPEC
    raise AttributeError(name)
